"""Harness Engine worker client and harness adapters.

The client (`HarnessClient`, `AsyncHarnessClient`) speaks the data-plane HTTP API; the
adapters plug into each harness SDK's own persistence interface:

- `harness_engine.langgraph.HarnessCheckpointSaver` (LangGraph `BaseCheckpointSaver`)
- `harness_engine.claude.HarnessSessionStore` (Claude Agent SDK `SessionStore`)
- `harness_engine.strands.HarnessSessionRepository` (Strands `SessionRepository`)
"""

from ._core import (
    Appended,
    Binding,
    Fence,
    Head,
    ObjectPage,
    PendingState,
    StoredObject,
    StreamEntry,
    StreamInfo,
)
from .client import AsyncHarnessClient, AsyncWorker, HarnessClient, Worker
from .errors import (
    Conflict,
    DeadlineExceeded,
    ForbiddenScope,
    HarnessError,
    IdempotencyMismatch,
    Invalid,
    NotFound,
    RateLimited,
    RevisionConflict,
    RunUncertain,
    StaleEpoch,
    StaleLease,
    TooLarge,
    TransportError,
    Unauthenticated,
    Unavailable,
)

__all__ = [
    "Appended",
    "AsyncHarnessClient",
    "AsyncWorker",
    "Binding",
    "Conflict",
    "DeadlineExceeded",
    "Fence",
    "ForbiddenScope",
    "HarnessClient",
    "HarnessError",
    "Head",
    "IdempotencyMismatch",
    "Invalid",
    "NotFound",
    "ObjectPage",
    "PendingState",
    "RateLimited",
    "RevisionConflict",
    "RunUncertain",
    "StaleEpoch",
    "StaleLease",
    "StoredObject",
    "StreamEntry",
    "StreamInfo",
    "TooLarge",
    "TransportError",
    "Unauthenticated",
    "Unavailable",
    "Worker",
]
