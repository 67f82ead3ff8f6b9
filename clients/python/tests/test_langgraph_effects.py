"""A LangGraph agent whose refund tool is wrapped by `effect_tool`: a scripted model (no
LLM) asks for a refund, `ToolNode` runs it, the run ledger records it. Re-running the
turn (a replacement worker resuming it) returns the recorded refund instead of issuing a
second one; a dropped answer is reconciled by key; a tool that is not wrapped runs as
before. The provider is `payments_service.py`, its own process."""

from __future__ import annotations

import uuid
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.runnables import RunnableConfig
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode

from harness_engine import HarnessClient
from harness_engine.effects import EffectContext, effect_key
from harness_engine.langgraph.effects import current_effect_key, effect_tool
from test_effects import ARGS, Payments, payments  # noqa: F401  (the fixture)


def graph(tools: list[Any], calls: list[dict[str, Any]]) -> Any:
    def model(state: MessagesState) -> dict[str, Any]:
        if isinstance(state["messages"][-1], ToolMessage):
            return {"messages": [AIMessage("done")]}
        return {"messages": [AIMessage("", tool_calls=calls)]}

    def route(state: MessagesState) -> str:
        last = state["messages"][-1]
        return "tools" if isinstance(last, AIMessage) and last.tool_calls else END

    g = StateGraph(MessagesState)
    g.add_node("model", model)
    g.add_node("tools", ToolNode(tools))
    g.add_edge(START, "model")
    g.add_conditional_edges("model", route, ["tools", END])
    g.add_edge("tools", "model")
    return g.compile()


def started(client: HarnessClient) -> str:
    b = client.bind("refunds.v3", f"lg-refund-{uuid.uuid4().hex}", "deepagents")
    client.worker(b).append_event(
        {"type": "RunStarted", "run_id": "run-1", "turn_id": "t1", "agent_id": "refunds.v3",
         "versions": {"model": "scripted-1"}, "payload": {}}
    )
    return b.binding_id


def tools_for(client: HarnessClient, binding: str, payments: Payments, seen: list[str]) -> list[Any]:
    @tool
    def issue_refund(order: str, amount_cents: int) -> dict:
        """Refund an order."""
        return payments.refund(current_effect_key(), order=order, amount_cents=amount_cents)

    @tool
    def lookup_order(order: str) -> str:
        """Read an order (no effect: not wrapped)."""
        seen.append(order)
        return f"order {order}: shipped"

    def context(config: RunnableConfig) -> EffectContext:
        c = config["configurable"]
        return EffectContext(client.worker(binding), c["run_id"], c["turn_id"], "refunds.v3")

    return [effect_tool(issue_refund, context, lookup=payments.lookup, backoff=0.01), lookup_order]


CALLS = [
    {"name": "issue_refund", "args": ARGS, "id": "call-1"},
    {"name": "lookup_order", "args": {"order": "A-1"}, "id": "call-2"},
]
CONFIG = {"configurable": {"run_id": "run-1", "turn_id": "t1"}}


def tool_reply(result: dict[str, Any], name: str) -> str:
    return next(m.content for m in result["messages"] if isinstance(m, ToolMessage) and m.name == name)


def test_a_rerun_turn_returns_the_recorded_refund(client, payments) -> None:
    b = started(client)
    seen: list[str] = []
    agent = graph(tools_for(client, b, payments, seen), CALLS)
    first = agent.invoke({"messages": [HumanMessage("refund A-1")]}, CONFIG)
    again = agent.invoke({"messages": [HumanMessage("refund A-1")]}, CONFIG)
    assert tool_reply(first, "issue_refund") == tool_reply(again, "issue_refund")
    assert "rf_1" in tool_reply(first, "issue_refund")
    assert payments.count() == 1
    assert seen == ["A-1", "A-1"], "the unwrapped tool ran both times, as before"
    e = client.worker(b).get_effect(effect_key(b, "t1", "issue_refund", ARGS))
    assert (e["status"], e["via"], e["attempts"]) == ("confirmed", "direct", 1), e


def test_a_dropped_answer_inside_the_graph_is_reconciled(client, payments) -> None:
    b = started(client)
    payments.mode("drop")
    agent = graph(tools_for(client, b, payments, []), CALLS[:1])
    out = agent.invoke({"messages": [HumanMessage("refund A-1")]}, CONFIG)
    assert "rf_1" in tool_reply(out, "issue_refund")
    assert payments.count() == 1
    e = client.worker(b).get_effect(effect_key(b, "t1", "issue_refund", ARGS))
    assert (e["status"], e["via"]) == ("confirmed", "reconciliation"), e
