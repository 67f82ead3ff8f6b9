"""`ClaudeEffectHooks` against `serve` and the payments provider process. The Claude
Agent SDK dispatches hooks from its CLI over the control protocol, which cannot run on
this machine without the CLI and a model; so the hook callbacks are called here exactly
as the SDK calls them (its typed hook inputs as dicts), around a real provider call."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

from harness_engine import HarnessClient
from harness_engine.claude_effects import ClaudeEffectHooks
from harness_engine.effects import EffectContext, effect_key
from test_effects import ARGS, Payments, payments  # noqa: F401  (the fixture)

TOOL = "mcp__payments__issue_refund"


def started(client: HarnessClient) -> str:
    b = client.bind("refunds.v3", f"cl-refund-{uuid.uuid4().hex}", "claude_agent_sdk")
    client.worker(b).append_event(
        {"type": "RunStarted", "run_id": "run-1", "turn_id": "t1", "agent_id": "refunds.v3",
         "versions": {"model": "scripted-1"}, "payload": {}}
    )
    return b.binding_id


def hooks_for(client: HarnessClient, binding: str, payments: Payments) -> ClaudeEffectHooks:
    return ClaudeEffectHooks(
        lambda: EffectContext(client.worker(binding), "run-1", "t1", "refunds.v3"),
        {TOOL: payments.lookup},
        backoff=0.01,
    )


def pre(use_id: str) -> dict[str, Any]:
    return {"hook_event_name": "PreToolUse", "session_id": "s", "transcript_path": "/dev/null",
            "cwd": "/", "tool_name": TOOL, "tool_input": ARGS, "tool_use_id": use_id}


async def one_call(h: ClaudeEffectHooks, binding: str, payments: Payments) -> dict[str, Any]:
    """What the SDK does around one tool call: PreToolUse, the tool, PostToolUse(Failure)."""
    use_id = f"toolu_{uuid.uuid4().hex[:12]}"
    decision = await h.pre_tool_use(pre(use_id), use_id, None)
    if decision:
        return decision
    key = effect_key(binding, "t1", TOOL, ARGS)
    try:
        response = payments.refund(key, **ARGS)
    except Exception as e:  # the tool failed as the SDK would report it
        await h.post_tool_use_failure({**pre(use_id), "hook_event_name": "PostToolUseFailure",
                                       "error": type(e).__name__}, use_id, None)
        return {"failed": True}
    await h.post_tool_use({**pre(use_id), "hook_event_name": "PostToolUse",
                           "tool_response": response}, use_id, None)
    return {"response": response}


def test_hooks_match_only_the_listed_tools(client, payments) -> None:
    matchers = hooks_for(client, started(client), payments).hooks()
    assert sorted(matchers) == ["PostToolUse", "PostToolUseFailure", "PreToolUse"]
    assert all(m[0].matcher == "mcp__payments__issue_refund" for m in matchers.values())


def test_a_second_call_is_denied_with_the_recorded_refund(client, payments) -> None:
    b = started(client)
    h = hooks_for(client, b, payments)
    first = asyncio.run(one_call(h, b, payments))
    assert first["response"]["refund_id"] == "rf_1"
    again = asyncio.run(one_call(hooks_for(client, b, payments), b, payments))
    out = again["hookSpecificOutput"]
    assert out["permissionDecision"] == "deny" and "rf_1" in out["permissionDecisionReason"], out
    assert payments.count() == 1
    e = client.worker(b).get_effect(effect_key(b, "t1", TOOL, ARGS))
    assert (e["status"], e["via"], e["attempts"]) == ("confirmed", "direct", 1), e


def test_a_failed_call_is_reconciled_by_key(client, payments) -> None:
    b = started(client)
    payments.mode("drop")
    assert asyncio.run(one_call(hooks_for(client, b, payments), b, payments)) == {"failed": True}
    assert payments.count() == 1
    e = client.worker(b).get_effect(effect_key(b, "t1", TOOL, ARGS))
    assert (e["status"], e["via"]) == ("confirmed", "reconciliation"), e
