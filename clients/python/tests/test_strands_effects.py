"""`EffectHooks` under the real Strands agent loop (scripted model, no LLM): the refund
tool's call is recorded through the agent's own Before/AfterToolCall hooks. A second
agent re-running the turn (a replacement worker) gets the recorded refund, not a second
one; a dropped answer is reconciled by key; an unlisted tool runs as before. The
provider is `payments_service.py`, its own process."""

from __future__ import annotations

import uuid
from typing import Any

from strands import Agent, tool

from harness_engine import HarnessClient
from harness_engine.effects import EffectContext, effect_key
from harness_engine.strands_effects import EffectHooks
from scripted_strands import ScriptedModel
from test_effects import ARGS, Payments, payments  # noqa: F401  (the fixture)


def started(client: HarnessClient) -> str:
    b = client.bind("refunds.v3", f"st-refund-{uuid.uuid4().hex}", "strands")
    client.worker(b).append_event(
        {"type": "RunStarted", "run_id": "run-1", "turn_id": "t1", "agent_id": "refunds.v3",
         "versions": {"model": "scripted-1"}, "payload": {}}
    )
    return b.binding_id


def agent(client: HarnessClient, binding: str, payments: Payments, seen: list[str]) -> tuple[Agent, ScriptedModel]:
    @tool
    def issue_refund(order: str, amount_cents: int) -> str:
        """Refund an order."""
        key = effect_key(binding, "t1", "issue_refund", {"order": order, "amount_cents": amount_cents})
        return str(payments.refund(key, order=order, amount_cents=amount_cents)["refund_id"])

    @tool
    def lookup_order(order: str) -> str:
        """Read an order (not listed: no effect)."""
        seen.append(order)
        return "shipped"

    model = ScriptedModel(
        [
            {"tool": "issue_refund", "id": f"tu-{uuid.uuid4().hex[:8]}", "input": ARGS},
            {"tool": "lookup_order", "id": f"tu-{uuid.uuid4().hex[:8]}", "input": {"order": "A-1"}},
            {"text": "refunded"},
        ]
    )
    hooks = EffectHooks(
        lambda: EffectContext(client.worker(binding), "run-1", "t1", "refunds.v3"),
        {"issue_refund": payments.lookup},
        backoff=0.01,
    )
    return Agent(model=model, tools=[issue_refund, lookup_order], hooks=[hooks], callback_handler=None), model


def tool_results(a: Agent) -> list[Any]:
    return [
        c["toolResult"] for m in a.messages for c in m["content"] if "toolResult" in c
    ]


def test_a_rerun_turn_does_not_refund_twice(client, payments) -> None:
    b = started(client)
    seen: list[str] = []
    first, _ = agent(client, b, payments, seen)
    first("refund order A-1")
    assert tool_results(first)[0]["status"] == "success"
    assert payments.count() == 1
    e = client.worker(b).get_effect(effect_key(b, "t1", "issue_refund", ARGS))
    assert (e["status"], e["via"], e["attempts"]) == ("confirmed", "direct", 1), e
    assert e["result"][0]["text"] == "rf_1", e

    second, _ = agent(client, b, payments, seen)
    second("refund order A-1")
    again = tool_results(second)[0]
    assert "already done" in again["content"][0]["text"] and "rf_1" in again["content"][0]["text"], again
    assert payments.count() == 1, "the replacement did not refund again"
    assert seen == ["A-1", "A-1"], "the unlisted tool ran both times, as before"


def test_a_dropped_answer_is_reconciled_by_key(client, payments) -> None:
    b = started(client)
    payments.mode("drop")
    a, _ = agent(client, b, payments, [])
    a("refund order A-1")
    assert tool_results(a)[0]["status"] == "error"
    assert payments.count() == 1
    e = client.worker(b).get_effect(effect_key(b, "t1", "issue_refund", ARGS))
    assert (e["status"], e["via"]) == ("confirmed", "reconciliation"), e
