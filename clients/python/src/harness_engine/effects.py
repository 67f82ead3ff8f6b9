"""Effects on the outside world, recorded in the run ledger so they never happen twice.

The algorithm of spec 002 §5.3, as one function (`run_effect`) and a decorator
(`effect`):

1. The effect's key derives from the binding, the turn, the tool and the canonical
   arguments, so a worker that regenerates the same intent (a replacement resuming the
   turn) reuses it.
2. A recorded outcome decides first: `confirmed` returns the recorded result without
   calling anything; `attempted` (the last worker died between the call and its record)
   or `unknown` is reconciled by asking the provider, by key, with backoff and a fixed
   budget; `refused` allows a new attempt, unless a person recorded it (then
   `EffectRefused`: the turn goes on without it, a new intent gets a new key);
   `awaiting_human` raises `EffectNeedsHuman`.
3. Otherwise the attempt is appended (durable) before the call.
4. The call's result is recorded as `confirmed`; `EffectRefused` from the call as
   `refused`; any other failure as `unknown`, then reconciled at once.
5. An unknown outcome that reconciliation cannot settle (no lookup, or the provider does
   not know within the budget) raises a human-review request in the ledger, and the
   effect cannot be attempted again until a person records the outcome. It is never
   read as success or as failure.

The tool receives the key and should pass it to the provider as its idempotency key.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from .client import Worker
from .errors import HarnessError

T = TypeVar("T")

Outcome = Literal["confirmed", "refused"]


class EffectRefused(Exception):
    """Raise from a tool when the provider definitely did not apply the request (a
    validation error, a declined card): a new attempt is allowed."""


class EffectNeedsHuman(Exception):
    """The effect's outcome is unknown and reconciliation could not settle it: a person
    must record it (confirmed or refused) before anything retries it."""

    def __init__(self, key: str, status: str, message: str) -> None:
        super().__init__(message)
        self.key = key
        self.status = status


class ToolFailed(Exception):
    """A tool ended in failure as its SDK reports it (no exception of ours to pass on):
    its outcome is unknown until reconciled."""


@dataclass(frozen=True)
class Lookup:
    """What the provider says about a key: `confirmed` with its result, or `refused`."""

    outcome: Outcome
    result: Any = None


LookupFn = Callable[[str], Lookup | None] | None
"""How a tool's provider is asked about a key (`None`: it cannot be)."""


def canonical(value: Any) -> str:
    """JSON with sorted keys and no whitespace: the same arguments, the same text."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def effect_key(binding_id: str, turn_id: str, tool: str, args: Mapping[str, Any]) -> str:
    """The effect's idempotency key (spec 002 §5.3): binding, turn, tool, canonical args."""
    text = "\x1f".join([binding_id, turn_id, tool, canonical(dict(args))])
    return "eff-" + hashlib.sha256(text.encode()).hexdigest()[:40]


@dataclass
class EffectContext:
    """Where an effect belongs: the worker (binding and fence), the run and the turn."""

    worker: Worker
    run_id: str
    turn_id: str
    agent_id: str
    versions: Mapping[str, str] | None = None

    def append(self, event_type: str, payload: Mapping[str, Any], *, step: str) -> dict[str, Any]:
        event = {
            "type": event_type,
            "run_id": self.run_id,
            "turn_id": self.turn_id,
            "agent_id": self.agent_id,
            "versions": dict(self.versions or {}),
            "payload": dict(payload),
        }
        # A retried append (a lost reply) replays the original instead of adding one.
        digest = hashlib.sha256(canonical(event).encode()).hexdigest()[:32]
        return self.worker.append_event(event, idempotency_key=f"ev-{step}-{digest}")


def _reconcile(
    ctx: EffectContext,
    key: str,
    attempt_seq: Any,
    lookup: Callable[[str], Lookup | None] | None,
    attempts: int,
    backoff: float,
) -> Lookup:
    """Asks the provider by key until it answers or the budget is spent; records what it
    said with `via: reconciliation`. Unanswered: a human-review request, then
    `EffectNeedsHuman`."""
    if lookup is not None:
        for i in range(max(1, attempts)):
            answer = lookup(key)
            if answer is not None:
                ctx.append(
                    "EffectOutcomeObserved",
                    {
                        "idempotency_key": key,
                        "outcome": answer.outcome,
                        "via": "reconciliation",
                        "result": answer.result,
                    },
                    step=f"reconciled-{attempt_seq}",
                )
                return answer
            if i + 1 < attempts:
                time.sleep(backoff * (2**i))
    reason = (
        "the provider cannot be asked about this key"
        if lookup is None
        else f"the provider did not know the key after {attempts} lookups"
    )
    try:
        ctx.append(
            "HumanReviewRequested",
            {"idempotency_key": key, "reason": reason},
            step=f"review-{attempt_seq}",
        )
    except HarnessError as e:
        # Already awaiting a person (a previous worker asked): nothing more to record.
        if e.code != "conflict":
            raise
    raise EffectNeedsHuman(key, "awaiting_human", f"effect {key}: {reason}; a person decides")


@dataclass(frozen=True)
class Begun:
    """What `begin_effect` decided: `done` with a recorded `result` (call nothing), or an
    attempt appended under `key` (call the provider, then `finish_effect`)."""

    key: str
    done: bool
    result: Any = None
    attempt_seq: Any = None


def begin_effect(
    ctx: EffectContext,
    tool: str,
    args: Mapping[str, Any],
    *,
    lookup: Callable[[str], Lookup | None] | None = None,
    irreversible: bool = True,
    reconcile_attempts: int = 3,
    backoff: float = 0.2,
) -> Begun:
    """Steps 1 to 3: the key, what the ledger already knows, and the durable attempt."""
    key = effect_key(ctx.worker.binding_id, ctx.turn_id, tool, args)
    known = ctx.worker.get_effect(key)
    if known is not None:
        status = known.get("status")
        if status == "confirmed":
            return Begun(key, True, known.get("result"))
        if status == "awaiting_human":
            raise EffectNeedsHuman(key, status, f"effect {key} awaits a person's decision")
        if status == "refused" and known.get("via") == "human":
            raise EffectRefused(f"effect {key}: a person recorded that it was not applied")
        if status in ("attempted", "unknown"):
            settled = _reconcile(
                ctx, key, known.get("last_attempt_seq"), lookup, reconcile_attempts, backoff
            )
            if settled.outcome == "confirmed":
                return Begun(key, True, settled.result)
            # refused: the provider never applied it, a new attempt may go ahead
    try:
        attempted = ctx.append(
            "EffectAttempted",
            {"tool": tool, "idempotency_key": key, "args": dict(args), "irreversible": irreversible},
            step=f"attempt-{(known or {}).get('attempts', 0)}",
        )
    except HarnessError as e:
        if e.code == "effect_confirmed":
            return Begun(key, True, (e.details.get("effect") or {}).get("result"))
        if e.code == "effect_unresolved":
            # Another worker attempted it between our read and our append.
            now = ctx.worker.get_effect(key) or {}
            settled = _reconcile(
                ctx, key, now.get("last_attempt_seq"), lookup, reconcile_attempts, backoff
            )
            if settled.outcome == "confirmed":
                return Begun(key, True, settled.result)
            raise EffectRefused(f"effect {key} was refused by the provider") from e
        raise
    return Begun(key, False, attempt_seq=(attempted.get("effect") or {}).get("last_attempt_seq"))


def finish_effect(
    ctx: EffectContext,
    begun: Begun,
    *,
    result: Any = None,
    error: BaseException | None = None,
    lookup: Callable[[str], Lookup | None] | None = None,
    reconcile_attempts: int = 3,
    backoff: float = 0.2,
) -> Any:
    """Steps 4 and 5: records the call's outcome (`error` None: confirmed with `result`;
    `EffectRefused`: refused, re-raised; anything else: unknown, then reconciled) and
    returns the result the caller should see."""
    key, seq = begun.key, begun.attempt_seq
    if error is None:
        ctx.append(
            "EffectOutcomeObserved",
            {"idempotency_key": key, "outcome": "confirmed", "via": "direct", "result": result},
            step=f"confirmed-{seq}",
        )
        return result
    if isinstance(error, EffectRefused):
        ctx.append(
            "EffectOutcomeObserved",
            {"idempotency_key": key, "outcome": "refused", "via": "direct"},
            step=f"refused-{seq}",
        )
        raise error
    ctx.append(
        "EffectOutcomeObserved",
        {
            "idempotency_key": key,
            "outcome": "unknown",
            "via": "direct",
            "result": {"error": type(error).__name__},
        },
        step=f"unknown-{seq}",
    )
    settled = _reconcile(ctx, key, seq, lookup, reconcile_attempts, backoff)
    if settled.outcome == "confirmed":
        return settled.result
    raise EffectRefused(f"effect {key} was not applied ({type(error).__name__})") from error


def run_effect(
    ctx: EffectContext,
    tool: str,
    args: Mapping[str, Any],
    call: Callable[[str], T],
    *,
    lookup: Callable[[str], Lookup | None] | None = None,
    irreversible: bool = True,
    reconcile_attempts: int = 3,
    backoff: float = 0.2,
) -> T | Any:
    """Runs `call(key)` at most once per intent, with its attempt and outcome in the
    ledger (see the module documentation). Returns the call's result, or the recorded
    result of an earlier confirmed attempt."""
    begun = begin_effect(
        ctx,
        tool,
        args,
        lookup=lookup,
        irreversible=irreversible,
        reconcile_attempts=reconcile_attempts,
        backoff=backoff,
    )
    if begun.done:
        return begun.result
    try:
        result = call(begun.key)
    except Exception as e:
        return finish_effect(
            ctx, begun, error=e, lookup=lookup, reconcile_attempts=reconcile_attempts, backoff=backoff
        )
    return finish_effect(ctx, begun, result=result)


def effect(
    tool: str,
    *,
    lookup: Callable[[str], Lookup | None] | None = None,
    irreversible: bool = True,
    reconcile_attempts: int = 3,
    backoff: float = 0.2,
) -> Callable[[Callable[..., T]], Callable[..., T]]:
    """Decorates `fn(key, **args)` so that calling it as `fn(ctx, **args)` goes through
    `run_effect` (the key is passed as the first argument)."""

    def wrap(fn: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(fn)
        def run(ctx: EffectContext, **args: Any) -> T:
            return run_effect(
                ctx,
                tool,
                args,
                lambda key: fn(key, **args),
                lookup=lookup,
                irreversible=irreversible,
                reconcile_attempts=reconcile_attempts,
                backoff=backoff,
            )

        return run

    return wrap
