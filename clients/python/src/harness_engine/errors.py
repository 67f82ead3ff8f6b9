"""The data plane's error model as typed exceptions.

Every refusal from the server is one JSON shape, ``{code, message, details}`` (see
docs/api.md, "Errors"). Each stable ``code`` maps to one exception class here, so a
worker can ``except StaleLease`` instead of parsing strings.
"""

from __future__ import annotations

from typing import Any


class HarnessError(Exception):
    """A refusal from the data plane, or a transport failure that outlasted retries."""

    code: str = "error"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        status: int | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        if code is not None:
            self.code = code
        self.message = message
        self.status = status
        self.details: dict[str, Any] = details or {}

    def __str__(self) -> str:
        where = f" (HTTP {self.status})" if self.status else ""
        return f"{self.code}{where}: {self.message}"


class StaleLease(HarnessError):
    """This worker's lease generation is not the binding's: it was replaced. Stop."""

    code = "stale_lease"


class StaleEpoch(HarnessError):
    """The conversation was cleared into another epoch."""

    code = "stale_epoch"


class RevisionConflict(HarnessError):
    """Another commit won; ``details["actual"]`` is the durable revision."""

    code = "revision_conflict"

    @property
    def actual(self) -> int | None:
        value = self.details.get("actual")
        return value if isinstance(value, int) else None


class IdempotencyMismatch(HarnessError):
    """The idempotency key was already used with another payload."""

    code = "idempotency_mismatch"


class RunUncertain(HarnessError):
    """The run is marked uncertain; nothing commits under it."""

    code = "run_uncertain"


class Conflict(HarnessError):
    """Another rule of the current state refused the write (object exists, version moved)."""

    code = "conflict"


class Invalid(HarnessError):
    code = "invalid"


class TooLarge(HarnessError):
    code = "too_large"


class RateLimited(HarnessError):
    code = "rate_limited"

    @property
    def retry_after(self) -> float | None:
        value = self.details.get("retry_after")
        return float(value) if isinstance(value, (int, float)) else None


class ForbiddenScope(HarnessError):
    code = "forbidden_scope"


class Unauthenticated(HarnessError):
    code = "unauthenticated"


class NotFound(HarnessError):
    code = "not_found"


class Unavailable(HarnessError):
    """The store or authenticator failed; safe to retry with the same idempotency key."""

    code = "unavailable"


class DeadlineExceeded(HarnessError):
    """The server's request deadline passed; a write's outcome is unknown."""

    code = "timeout"


class TransportError(HarnessError):
    """The request never got an answer (connection refused, reset, client timeout)."""

    code = "transport"


_BY_CODE: dict[str, type[HarnessError]] = {
    cls.code: cls
    for cls in (
        StaleLease,
        StaleEpoch,
        RevisionConflict,
        IdempotencyMismatch,
        RunUncertain,
        Conflict,
        Invalid,
        TooLarge,
        RateLimited,
        ForbiddenScope,
        Unauthenticated,
        NotFound,
        Unavailable,
        DeadlineExceeded,
    )
}


def error_from_response(status: int, body: Any, retry_after: str | None = None) -> HarnessError:
    """Builds the typed exception for an error response (any status >= 400)."""
    code = "internal" if status >= 500 else "error"
    message = f"HTTP {status}"
    details: dict[str, Any] = {}
    if isinstance(body, dict):
        code = str(body.get("code") or code)
        message = str(body.get("message") or message)
        raw = body.get("details")
        if isinstance(raw, dict):
            details = dict(raw)
    if retry_after is not None and "retry_after" not in details:
        try:
            details["retry_after"] = float(retry_after)
        except ValueError:
            pass
    cls = _BY_CODE.get(code, HarnessError)
    return cls(message, code=code, status=status, details=details)
