"""Claude Agent SDK: effects recorded around tool calls, through the SDK's hooks.

`ClaudeEffectHooks(context, tools={"mcp__payments__issue_refund": lookup, ...})` gives
`hooks()` for `ClaudeAgentOptions(hooks=...)`. For each call of a listed tool,
`PreToolUse` runs steps 1 to 3 of `harness_engine.effects` (the key from binding, turn,
tool and arguments; what the ledger already knows; the durable attempt); `PostToolUse`
records the outcome as confirmed with the tool's response, and `PostToolUseFailure` as
unknown, then reconciled through the tool's lookup. An effect already confirmed is
denied with a reason carrying the recorded result, which the model reads instead of
running the tool again; one that needs a person is denied saying so. Tools that are not
listed are not matched, so they run exactly as before.

The tool itself should pass the effect's key to its provider: it is
`harness_engine.effects.effect_key(binding, turn, tool name, arguments)`.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from typing import Any

from claude_agent_sdk import HookMatcher

from .effects import (
    Begun,
    EffectContext,
    EffectNeedsHuman,
    EffectRefused,
    LookupFn,
    ToolFailed,
    begin_effect,
    finish_effect,
)




def _deny(reason: str) -> dict[str, Any]:
    return {
        "hookSpecificOutput": {
            "hookEventName": "PreToolUse",
            "permissionDecision": "deny",
            "permissionDecisionReason": reason,
        }
    }


class ClaudeEffectHooks:
    def __init__(
        self,
        context: Callable[[], EffectContext],
        tools: Mapping[str, LookupFn],
        *,
        reconcile_attempts: int = 3,
        backoff: float = 0.2,
    ) -> None:
        self.context = context
        self.tools = dict(tools)
        self.reconcile_attempts = reconcile_attempts
        self.backoff = backoff
        self._begun: dict[str, tuple[EffectContext, Begun]] = {}

    def hooks(self) -> dict[str, list[HookMatcher]]:
        """The `hooks` of `ClaudeAgentOptions`, matching the listed tools only."""
        names = "|".join(re.escape(n) for n in sorted(self.tools))
        return {
            "PreToolUse": [HookMatcher(matcher=names, hooks=[self.pre_tool_use])],  # type: ignore[list-item]
            "PostToolUse": [HookMatcher(matcher=names, hooks=[self.post_tool_use])],  # type: ignore[list-item]
            "PostToolUseFailure": [HookMatcher(matcher=names, hooks=[self.post_tool_use_failure])],  # type: ignore[list-item]
        }

    async def pre_tool_use(
        self, input_data: Mapping[str, Any], tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        name = str(input_data.get("tool_name"))
        if name not in self.tools:
            return {}
        ctx = self.context()
        args = dict(input_data.get("tool_input") or {})
        try:
            begun = await asyncio.to_thread(
                begin_effect,
                ctx,
                name,
                args,
                lookup=self.tools[name],
                reconcile_attempts=self.reconcile_attempts,
                backoff=self.backoff,
            )
        except (EffectNeedsHuman, EffectRefused) as e:
            return _deny(f"not run: {e}")
        if begun.done:
            return _deny(
                f"already done (effect {begun.key}); recorded result: "
                + json.dumps(begun.result, sort_keys=True, default=str)
            )
        self._begun[str(input_data.get("tool_use_id") or tool_use_id)] = (ctx, begun)
        return {}

    async def post_tool_use(
        self, input_data: Mapping[str, Any], tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        entry = self._begun.pop(str(input_data.get("tool_use_id") or tool_use_id), None)
        if entry is not None:
            ctx, begun = entry
            await asyncio.to_thread(
                finish_effect, ctx, begun, result=input_data.get("tool_response")
            )
        return {}

    async def post_tool_use_failure(
        self, input_data: Mapping[str, Any], tool_use_id: str | None, context: Any
    ) -> dict[str, Any]:
        entry = self._begun.pop(str(input_data.get("tool_use_id") or tool_use_id), None)
        if entry is None:
            return {}
        ctx, begun = entry
        name = str(input_data.get("tool_name"))
        try:
            await asyncio.to_thread(
                finish_effect,
                ctx,
                begun,
                error=ToolFailed(str(input_data.get("error"))),
                lookup=self.tools.get(name),
                reconcile_attempts=self.reconcile_attempts,
                backoff=self.backoff,
            )
        except (EffectNeedsHuman, EffectRefused):
            pass  # the failure stands; the ledger says what is known
        return {}
