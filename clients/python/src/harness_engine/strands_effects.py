"""Strands Agents: effects recorded around tool calls, through the agent's own hooks.

`EffectHooks(context, tools={"issue_refund": lookup, ...})` is a `HookProvider`: add it
to `Agent(hooks=[...])`. For each call of a listed tool, `BeforeToolCallEvent` runs
steps 1 to 3 of `harness_engine.effects` (the key from binding, turn, tool and
arguments; what the ledger already knows; the durable attempt) and `AfterToolCallEvent`
records the outcome (a successful tool result: confirmed; an error: unknown, then
reconciled through the tool's lookup). An effect already confirmed is not run again:
the call is cancelled with a message carrying the recorded result, which the model
reads as the tool's answer. One that needs a person is cancelled saying so. Tools that
are not listed run exactly as before.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from strands.hooks import AfterToolCallEvent, BeforeToolCallEvent, HookProvider, HookRegistry

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




class EffectHooks(HookProvider):
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

    def register_hooks(self, registry: HookRegistry, **kwargs: Any) -> None:
        registry.add_callback(BeforeToolCallEvent, self.before)
        registry.add_callback(AfterToolCallEvent, self.after)

    def before(self, event: BeforeToolCallEvent) -> None:
        name = str(event.tool_use["name"])
        if name not in self.tools:
            return
        ctx = self.context()
        args = dict(event.tool_use.get("input") or {})
        try:
            begun = begin_effect(
                ctx,
                name,
                args,
                lookup=self.tools[name],
                reconcile_attempts=self.reconcile_attempts,
                backoff=self.backoff,
            )
        except EffectNeedsHuman as e:
            event.cancel_tool = f"not run: {e}"
            return
        except EffectRefused as e:
            event.cancel_tool = f"not run: {e}"
            return
        if begun.done:
            event.cancel_tool = (
                f"already done (effect {begun.key}); recorded result: "
                + json.dumps(begun.result, sort_keys=True, default=str)
            )
            return
        self._begun[str(event.tool_use["toolUseId"])] = (ctx, begun)

    def after(self, event: AfterToolCallEvent) -> None:
        entry = self._begun.pop(str(event.tool_use["toolUseId"]), None)
        if entry is None:
            return
        ctx, begun = entry
        name = str(event.tool_use["name"])
        result = event.result
        if result.get("status") == "success":
            finish_effect(ctx, begun, result=[dict(c) for c in result.get("content", [])])
            return
        try:
            finish_effect(
                ctx,
                begun,
                error=ToolFailed(name),
                lookup=self.tools[name],
                reconcile_attempts=self.reconcile_attempts,
                backoff=self.backoff,
            )
        except (EffectNeedsHuman, EffectRefused):
            pass  # the tool's error result stands; the ledger says what is known
