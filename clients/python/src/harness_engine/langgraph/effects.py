"""LangGraph: tools whose every call goes through `harness_engine.effects`.

`effect_tool(tool, context)` returns a tool with the same name, description and
arguments; put it in a `ToolNode` (or any agent) instead of the original. Each call is
recorded in the run ledger before it happens and settled after, so a replacement worker
that re-runs the turn gets the recorded result instead of a second refund. The wrapped
tool reads the effect's key with `current_effect_key()` and gives it to the provider as
its idempotency key. Tools that are not wrapped run exactly as before.

`context(config)` builds the `EffectContext` (worker, run, turn, agent) from the
`RunnableConfig` of the call, so one graph serves every conversation.

An effect whose outcome only a person can settle (`EffectNeedsHuman`) interrupts the
graph with an effect review (`interrupt({"type": "effect_review", ...})`, which
`HarnessCheckpointSaver` commits as the binding's pending interrupt). The control plane
resumes that interrupt with `confirmed` or `refused`, which records the person's
decision in the run ledger; the worker then resumes the graph
(`Command(resume=decision)`) and the tool returns the confirmed result, or raises
`EffectRefused` without calling the provider again. With `review=False` the
`EffectNeedsHuman` propagates instead.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from langchain_core.runnables import RunnableConfig
from langchain_core.tools import BaseTool, StructuredTool

from langgraph.types import interrupt

from ..effects import EffectContext, EffectNeedsHuman, Lookup, run_effect

_KEY: ContextVar[str | None] = ContextVar("harness_engine_effect_key", default=None)


def current_effect_key() -> str:
    """The idempotency key of the effect being run (inside a tool wrapped by
    `effect_tool`)."""
    key = _KEY.get()
    if key is None:
        raise RuntimeError("no effect is running: wrap the tool with effect_tool()")
    return key


def effect_tool(
    tool: BaseTool,
    context: Callable[[RunnableConfig], EffectContext],
    *,
    lookup: Callable[[str], Lookup | None] | None = None,
    irreversible: bool = True,
    reconcile_attempts: int = 3,
    backoff: float = 0.2,
    review: bool = True,
) -> BaseTool:
    """`tool`, with each call run through `run_effect` (see the module documentation)."""

    def run(config: RunnableConfig, **args: Any) -> Any:
        ctx = context(config)

        def call(key: str) -> Any:
            token = _KEY.set(key)
            try:
                return tool.invoke(args, config)
            finally:
                _KEY.reset(token)

        def attempt() -> Any:
            return run_effect(
                ctx,
                tool.name,
                args,
                call,
                lookup=lookup,
                irreversible=irreversible,
                reconcile_attempts=reconcile_attempts,
                backoff=backoff,
            )

        try:
            return attempt()
        except EffectNeedsHuman as waiting:
            if not review:
                raise
            # Stops the graph here; on resume it returns and the ledger holds the
            # person's decision, which the second attempt reads (and never re-calls a
            # confirmed or person-refused effect).
            interrupt(
                {
                    "type": "effect_review",
                    "idempotency_key": waiting.key,
                    "tool": tool.name,
                    "reason": str(waiting),
                    "allowed_decisions": ["confirmed", "refused"],
                }
            )
            return attempt()

    return StructuredTool.from_function(
        func=run,
        name=tool.name,
        description=tool.description,
        args_schema=tool.args_schema,
    )
