"""The refund story of spec 002 §5, end to end: a LangGraph agent (a scripted model, no
LLM) whose `issue_refund` tool is wrapped by `effect_tool`, its checkpoints committed by
`HarnessCheckpointSaver`, a payments provider running as its own process
(`payments_service.py`), and worker processes that die or stall at the worst moment.

- A worker SIGKILLed after the provider applied the refund and before the outcome was
  recorded; the replacement, at the next lease generation, resumes the graph from the
  durable head: exactly one refund, the ledger shows the attempt and the outcome
  `confirmed` via `reconciliation`, the old fence's late writes are refused.
- A worker stalled at the same point goes on after its replacement finished: its own
  late writes are refused with `stale_lease` and nothing is refunded twice.
- The provider refused: a new attempt is allowed and succeeds.
- The provider cannot be asked: the graph stops on an effect review, which the control
  plane finds as the binding's pending interrupt and resumes with the person's decision
  (`confirmed` or `refused`); the decision lands in the ledger, nothing retries the
  refund, and the run completes.

Serve mode has no operator: the replacement's fence is raised as the operator's step 2
does it (`conftest.raise_fence`), on whichever store the server runs (SQLite, or FerretDB
in the second pass of scripts/python-tests.sh)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode
from langgraph.types import Command

from conftest import raise_fence
from harness_engine import Fence, HarnessClient, StaleLease
from harness_engine.effects import EffectContext, EffectRefused, effect_key
from harness_engine.langgraph import CODEC, HarnessCheckpointSaver
from harness_engine.langgraph.effects import current_effect_key, effect_tool
from test_effects import ARGS, Payments, payments  # noqa: F401  (the fixture)

HERE = Path(__file__).parent
# The ledger run is `run-1` (RunStarted); LangGraph's own run ids stay LangGraph's (a
# configurable `run_id` would make LangGraph treat a second invoke as a replay of the first).
CONFIG: RunnableConfig = {"configurable": {"thread_id": "refund", "turn_id": "t1"}}
CALL = {"name": "issue_refund", "args": ARGS, "id": "call-1"}


def agent_for(
    client: HarnessClient,
    binding_id: str,
    fence: Fence,
    payments_url: str,
    after_apply: Callable[[], None] | None = None,
) -> Any:
    """The agent as one worker runs it, at `fence`."""
    payments = Payments(payments_url)
    ledger = client.worker(binding_id, fence=fence)
    saver = HarnessCheckpointSaver(client.worker(binding_id, fence=fence, codec=CODEC))

    @tool
    def issue_refund(order: str, amount_cents: int) -> dict:
        """Refund an order."""
        result = payments.refund(current_effect_key(), order=order, amount_cents=amount_cents)
        if after_apply is not None:
            after_apply()
        return result

    def context(config: RunnableConfig) -> EffectContext:
        c = config["configurable"]
        return EffectContext(ledger, "run-1", c["turn_id"], "refunds.v3", {"model": "scripted-1"})

    def model(state: MessagesState) -> dict[str, Any]:
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=[CALL])]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    refund = effect_tool(issue_refund, context, lookup=payments.lookup, reconcile_attempts=2, backoff=0.01)
    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode([refund], handle_tool_errors=EffectRefused))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile(checkpointer=saver)


WORKER = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, os.environ["TESTS_DIR"])
    from langchain_core.messages import HumanMessage
    from harness_engine import Fence, HarnessClient, HarnessError
    from test_refund_e2e import CONFIG, agent_for

    def after_apply():
        if os.environ["AFTER_APPLY"] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        # Stalled (a long pause, a partition) until the test lets it go on.
        print("applied", flush=True)
        sys.stdin.readline()

    client = HarnessClient(os.environ["API"], token=os.environ["TOKEN"])
    fence = Fence(int(os.environ["EPOCH"]), int(os.environ["GENERATION"]))
    agent = agent_for(client, os.environ["BINDING"], fence, os.environ["PAYMENTS"], after_apply)
    try:
        # "sync": each step's checkpoint is durable before the next step runs, so the
        # head holds the model's tool call when the tool runs (LangGraph's default,
        # "async", may still be writing it when the process dies).
        agent.invoke({"messages": [HumanMessage("refund A-1")]}, CONFIG, durability="sync")
    except HarnessError as e:
        print(json.dumps({"refused": e.code}), flush=True)
        sys.exit(3)
    print(json.dumps({"refused": None}), flush=True)
    """
)


def worker_process(server: Any, binding_id: str, fence: Fence, payments: Payments, after: str) -> subprocess.Popen:
    env = dict(
        os.environ,
        TESTS_DIR=str(HERE),
        API=server.api,
        TOKEN=server.token,
        PAYMENTS=payments.url,
        BINDING=binding_id,
        EPOCH=str(fence.epoch),
        GENERATION=str(fence.lease_generation),
        AFTER_APPLY=after,
    )
    return subprocess.Popen(
        [sys.executable, "-c", WORKER],
        env=env,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


class ControlPlane:
    """What a control-plane service (a gateway, a support console) does over HTTP with
    its own token: read the run, find the pending interrupt, resume it."""

    def __init__(self, server: Any, binding_id: str) -> None:
        self.http = httpx.Client(
            base_url=f"{server.api}/v1/bindings/{binding_id}",
            headers={"Authorization": f"Bearer {server.token}"},
            timeout=10,
        )

    def run(self, fence: Fence) -> dict[str, Any]:
        r = self.http.get("/runs/item", params={"run_id": "run-1"}, headers=fence.headers())
        assert r.status_code == 200, r.text
        return r.json()

    def interrupt(self) -> dict[str, Any] | None:
        r = self.http.get("/interrupt")
        assert r.status_code == 200, r.text
        return r.json()["interrupt"]

    def resume(self, pending: dict[str, Any], decision: str, response: dict[str, Any]) -> dict[str, Any]:
        r = self.http.post(
            "/interrupt/resume",
            headers={"Idempotency-Key": f"answer-{pending['interrupt_id']}"},
            json={"interrupt_id": pending["interrupt_id"], "revision": pending["revision"],
                  "decision": decision, "response": response},
        )
        assert r.status_code == 200, r.text
        return r.json()


def started(client: HarnessClient) -> tuple[str, Fence]:
    b = client.bind("refunds.v3", f"refund-e2e-{uuid.uuid4().hex}", "deepagents")
    client.worker(b).append_event(
        {"type": "RunStarted", "run_id": "run-1", "turn_id": "t1", "agent_id": "refunds.v3",
         "versions": {"model": "scripted-1"}, "payload": {}}
    )
    return b.binding_id, b.fence


def replaced(server: Any, binding_id: str, old: Fence) -> Fence:
    """The operator's replacement: the store fence moves to the next lease generation."""
    raise_fence(server, binding_id, old.lease_generation + 1)
    return Fence(old.epoch, old.lease_generation + 1)


def tool_reply(result: dict[str, Any]) -> str:
    return next(str(m.content) for m in result["messages"] if isinstance(m, ToolMessage))


def complete(client: HarnessClient, binding_id: str, fence: Fence, outcome: str) -> None:
    client.worker(binding_id, fence=fence).append_event(
        {"type": "RunCompleted", "run_id": "run-1", "turn_id": "t1", "agent_id": "refunds.v3",
         "versions": {"model": "scripted-1"}, "payload": {"outcome": outcome}}
    )


def effect_events(run: dict[str, Any]) -> list[tuple[str, str | None, str | None]]:
    return [
        (e["type"], e["payload"].get("outcome") or e["payload"].get("decision"), e["payload"].get("via"))
        for e in run["events"]
        if e["type"].startswith(("Effect", "HumanReview"))
    ]


def test_a_worker_killed_after_the_refund_is_replaced_and_never_refunds_twice(server, client, payments) -> None:
    binding, old = started(client)
    killed = worker_process(server, binding, old, payments, "kill")
    _, err = killed.communicate(timeout=60)
    assert killed.returncode == -signal.SIGKILL, err
    assert payments.count() == 1, "the provider applied the refund before the kill"
    key = effect_key(binding, "t1", "issue_refund", ARGS)
    assert client.worker(binding, fence=old).get_effect(key)["status"] == "attempted"

    new = replaced(server, binding, old)
    agent = agent_for(client, binding, new, payments.url)
    # The durable head holds the model's tool call: the replacement resumes at the tool.
    assert agent.get_state(CONFIG).next == ("tools",)
    out = agent.invoke(None, CONFIG)
    assert "rf_1" in tool_reply(out) and out["messages"][-1].content == "done"
    assert payments.count() == 1

    # The old worker's late writes, in whatever order they arrive: refused, no change.
    stale = client.worker(binding, fence=old)
    with pytest.raises(StaleLease) as late_outcome:
        stale.append_event(
            {"type": "EffectOutcomeObserved", "run_id": "run-1", "turn_id": "t1", "agent_id": "refunds.v3",
             "payload": {"idempotency_key": key, "outcome": "confirmed", "via": "direct"}}
        )
    assert late_outcome.value.code == "stale_lease"
    with pytest.raises(StaleLease):
        agent_for(client, binding, old, payments.url).invoke({"messages": [HumanMessage("late")]}, CONFIG)

    complete(client, binding, new, "resolved")
    run = ControlPlane(server, binding).run(new)
    assert effect_events(run) == [
        ("EffectAttempted", None, None),
        ("EffectOutcomeObserved", "confirmed", "reconciliation"),
    ]
    effect = run["effects"][key]
    assert (effect["status"], effect["via"], effect["attempts"]) == ("confirmed", "reconciliation", 1)
    assert effect["result"]["refund_id"] == "rf_1"
    assert run["state"]["outcome"] == "resolved"


def test_a_stalled_worker_that_wakes_after_its_replacement_is_refused(server, client, payments) -> None:
    binding, old = started(client)
    stalled = worker_process(server, binding, old, payments, "pause")
    try:
        assert stalled.stdout is not None and stalled.stdout.readline().strip() == "applied"
        new = replaced(server, binding, old)
        out = agent_for(client, binding, new, payments.url).invoke(None, CONFIG)
        assert "rf_1" in tool_reply(out)

        # The old worker goes on and records what it saw: refused, it stops.
        rest, err = stalled.communicate("go on\n", timeout=60)
    finally:
        if stalled.poll() is None:
            stalled.kill()
            stalled.wait()
    assert stalled.returncode == 3, err
    assert json.loads(rest.strip().splitlines()[-1]) == {"refused": "stale_lease"}
    assert payments.count() == 1
    run = ControlPlane(server, binding).run(new)
    assert effect_events(run) == [
        ("EffectAttempted", None, None),
        ("EffectOutcomeObserved", "confirmed", "reconciliation"),
    ], json.dumps(run["events"])


def test_a_refused_refund_is_tried_again_and_succeeds(server, client, payments) -> None:
    binding, fence = started(client)
    payments.mode("refuse")
    agent = agent_for(client, binding, fence, payments.url)
    out = agent.invoke({"messages": [HumanMessage("refund A-1")]}, CONFIG)
    assert "refund declined" in tool_reply(out)
    key = effect_key(binding, "t1", "issue_refund", ARGS)
    assert client.worker(binding, fence=fence).get_effect(key)["status"] == "refused"
    assert payments.count() == 0

    payments.mode("ok")
    out = agent.invoke({"messages": [HumanMessage("please try again")]}, CONFIG)
    assert "rf_1" in [str(m.content) for m in out["messages"] if isinstance(m, ToolMessage)][-1]
    assert payments.count() == 1
    complete(client, binding, fence, "resolved")
    run = ControlPlane(server, binding).run(fence)
    assert effect_events(run) == [
        ("EffectAttempted", None, None),
        ("EffectOutcomeObserved", "refused", "direct"),
        ("EffectAttempted", None, None),
        ("EffectOutcomeObserved", "confirmed", "direct"),
    ]
    assert run["effects"][key]["attempts"] == 2


@pytest.mark.parametrize(
    ("mode", "decision", "refunds"),
    [("blind", "confirmed", 1), ("lost", "refused", 0)],
    ids=["applied-then-confirmed", "lost-then-refused"],
)
def test_an_outcome_nobody_can_tell_is_decided_by_a_person_through_the_interrupt(
    server, client, payments, mode: str, decision: str, refunds: int
) -> None:
    binding, fence = started(client)
    payments.mode(mode)
    agent = agent_for(client, binding, fence, payments.url)
    out = agent.invoke({"messages": [HumanMessage("refund A-1")]}, CONFIG)
    [stop] = out["__interrupt__"]
    key = effect_key(binding, "t1", "issue_refund", ARGS)
    assert stop.value["idempotency_key"] == key
    assert client.worker(binding, fence=fence).get_effect(key)["status"] == "awaiting_human"

    # The control plane finds the review as the binding's pending interrupt.
    control = ControlPlane(server, binding)
    pending = control.interrupt()
    assert pending is not None, "the effect review was not committed as the binding's interrupt"
    assert (pending["type"], pending["body"]["idempotency_key"]) == ("effect_review", key)
    assert pending["allowed_decisions"] == ["confirmed", "refused"]

    # Nothing retries it meanwhile, not even with the provider back: the worker asks
    # again, and the control plane answers the interrupt as it stands now.
    payments.mode("ok")
    again = agent.invoke(None, CONFIG)
    assert "__interrupt__" in again
    assert payments.count() == refunds
    pending = control.interrupt()
    assert pending is not None and pending["body"]["idempotency_key"] == key

    # A person checks the provider's books and answers; the worker resumes the graph.
    found = {"result": {"refund_id": "rf_1", "checked_by": "support"}} if decision == "confirmed" else {}
    resumed = control.resume(pending, decision, found)
    assert resumed["decision"] == decision
    assert control.interrupt() is None
    out = agent.invoke(Command(resume=decision), CONFIG)
    assert out["messages"][-1].content == "done"
    reply = tool_reply(out)
    assert ("rf_1" in reply) if decision == "confirmed" else ("not applied" in reply), reply
    assert payments.count() == refunds, "a person's decision is never followed by a second call"

    complete(client, binding, fence, "resolved" if decision == "confirmed" else "handed_to_human")
    run = control.run(fence)
    assert effect_events(run) == [
        ("EffectAttempted", None, None),
        ("EffectOutcomeObserved", "unknown", "direct"),
        ("HumanReviewRequested", None, None),
        ("HumanReviewResolved", decision, None),
    ]
    effect = run["effects"][key]
    assert (effect["status"], effect["via"], effect["attempts"]) == (decision, "human", 1)
    assert run["state"]["status"] == "completed"
