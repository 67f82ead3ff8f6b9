"""What the sync and async clients share: configuration, credentials, request building,
response parsing and the retry rule. No IO here except reading the token file.

The two clients differ only in how they send a `Call`; everything that decides *what* is
sent, and whether a retry is safe, lives here so they cannot drift apart.
"""

from __future__ import annotations

import base64
import hashlib
import os
import random
import threading
import time
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar
from urllib.parse import urlsplit

from ._wire import Reply
from .errors import HarnessError, Invalid, error_from_response

T = TypeVar("T")

ENDPOINT_ENV = "HARNESS_ENGINE_ENDPOINT"
TOKEN_FILE_ENV = "HARNESS_ENGINE_TOKEN_FILE"
DEFAULT_TOKEN_FILE = "/var/run/secrets/harness-engine/token"

# Statuses whose outcome is "not done, or unknown": retried only when the call is safe to
# repeat (a read, or a write whose Idempotency-Key or entry ids make a repeat a no-op).
RETRY_STATUSES = frozenset({429, 502, 503, 504})
# One wait between attempts is at most this long (before jitter); `Retry-After` at most 5 s.
RETRY_CAP = 2.0
# How long a call keeps retrying by default: longer than a data-plane restart (a rolling
# upgrade of the operator takes a few seconds), so a turn in flight survives it.
DEFAULT_RETRY_WINDOW = 30.0

try:  # optional: `pip install harness-engine[otel]`
    from opentelemetry.trace.propagation.tracecontext import (
        TraceContextTextMapPropagator as _Propagator,
    )

    _PROPAGATOR: Any = _Propagator()
except ImportError:  # pragma: no cover - exercised when opentelemetry-api is absent
    _PROPAGATOR = None


def trace_headers() -> dict[str, str]:
    """`traceparent` (and `tracestate`) of the current OpenTelemetry span, if any.

    Only W3C Trace Context goes out: baggage stays home (DESIGN §8, "baggage is empty by
    default"), and the server treats the header as correlation, never authority.
    """
    if _PROPAGATOR is None:
        return {}
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    return {k: v for k, v in carrier.items() if k in ("traceparent", "tracestate")}


def derived_key(prefix: str, *parts: str) -> str:
    """A stable Idempotency-Key from the identity of a logical write.

    The server keeps only a keyed digest of it, but keys are bounded (255 visible ASCII
    characters), so caller-chosen names are hashed rather than embedded.
    """
    digest = hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:40]
    return f"{prefix}-{digest}"


def new_key(prefix: str = "he") -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def sha256_digest(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


class TokenSource:
    """The bearer token: a fixed string, or a file re-read whenever it changes.

    Projected ServiceAccount tokens rotate (the kubelet rewrites the file well before
    expiry), so the file is stat-ed on every request and read again when its size or
    modification time moved.
    """

    def __init__(self, token: str | None = None, token_file: str | None = None) -> None:
        if token is not None and not token.strip():
            raise ValueError("token must not be empty")
        self._token = token.strip() if token else None
        self._file = token_file
        self._stamp: tuple[int, int] | None = None
        self._cached: str | None = None
        self._lock = threading.Lock()

    @property
    def file(self) -> str | None:
        return self._file

    def get(self) -> str:
        if self._token is not None:
            return self._token
        assert self._file is not None
        try:
            st = os.stat(self._file)
        except OSError as e:
            raise HarnessError(
                f"cannot read the token file {self._file}: {e.strerror}",
                code="unauthenticated",
            ) from e
        stamp = (st.st_mtime_ns, st.st_size)
        with self._lock:
            if stamp != self._stamp or self._cached is None:
                with open(self._file, encoding="utf-8") as f:
                    value = f.read().strip()
                if not value:
                    raise HarnessError(
                        f"the token file {self._file} is empty", code="unauthenticated"
                    )
                self._cached, self._stamp = value, stamp
            return self._cached


@dataclass(frozen=True)
class Settings:
    endpoint: str
    tokens: TokenSource
    subject: str | None
    timeout: float
    # At most this many retries of one call; None: as many as fit in `retry_window`.
    retries: int | None
    backoff: float
    # No retry starts later than this many seconds after the call's first attempt.
    retry_window: float = DEFAULT_RETRY_WINDOW
    # The HTTP proxy both clients use for the endpoint (`proxy_for`), or None.
    proxy: str | None = None


def resolve_settings(
    endpoint: str | None,
    token: str | None,
    token_file: str | None,
    subject: str | None,
    timeout: float,
    retries: int | None,
    backoff: float,
    retry_window: float = DEFAULT_RETRY_WINDOW,
) -> Settings:
    """Explicit arguments win; inside a sandbox the environment the operator sets
    (`HARNESS_ENGINE_ENDPOINT`, `HARNESS_ENGINE_TOKEN_FILE`) fills the rest."""
    endpoint = endpoint or os.environ.get(ENDPOINT_ENV)
    if not endpoint:
        raise ValueError(
            f"no endpoint: pass endpoint=... or set {ENDPOINT_ENV} (the sandbox template sets it)"
        )
    if not endpoint.startswith(("http://", "https://")):
        raise ValueError(f"endpoint must be an http(s) URL, got {endpoint!r}")
    if token is None:
        token_file = token_file or os.environ.get(TOKEN_FILE_ENV) or DEFAULT_TOKEN_FILE
    if retries is not None and retries < 0:
        raise ValueError("retries must be >= 0 (or None: bounded by retry_window)")
    if retry_window < 0:
        raise ValueError("retry_window must be >= 0 seconds")
    endpoint = endpoint.rstrip("/")
    return Settings(
        endpoint=endpoint,
        tokens=TokenSource(token, token_file),
        subject=subject,
        timeout=timeout,
        retries=retries,
        backoff=backoff,
        retry_window=retry_window,
        proxy=proxy_for(endpoint),
    )


def proxy_for(endpoint: str) -> str | None:
    """The proxy for `endpoint` from the standard variables (`HTTP_PROXY`, `HTTPS_PROXY`,
    `ALL_PROXY`, `NO_PROXY`, either case), read once here so that the sync and the async
    client make the same choice. Only `http://` proxies are supported."""
    parts = urlsplit(endpoint)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    if urllib.request.proxy_bypass(f"{parts.hostname}:{port}"):
        return None
    proxies = urllib.request.getproxies_environment()
    proxy = proxies.get(parts.scheme) or proxies.get("all")
    if not proxy:
        return None
    if not proxy.startswith("http://"):
        raise ValueError(
            f"proxy {proxy!r} for {endpoint}: only http:// proxies are supported; "
            "set NO_PROXY to reach the endpoint directly"
        )
    if parts.scheme == "https":
        raise ValueError(
            f"{endpoint} through proxy {proxy!r}: https endpoints through a proxy are not "
            "supported yet; set NO_PROXY to include the endpoint's host"
        )
    return proxy


@dataclass
class Call(Generic[T]):
    """One API call, transport-free: the sync and async clients both send it."""

    method: str
    path: str
    parse: Callable[[Reply], T]
    params: Mapping[str, str] | None = None
    headers: dict[str, str] = field(default_factory=dict)
    content: bytes | None = None
    json: Any = None
    # Safe to repeat after an ambiguous failure (reads, idempotent writes).
    retry_safe: bool = True
    # A 404 `not_found` answers None instead of raising (get of an absent object).
    none_on_404: bool = False


def headers_for(settings: Settings, call_headers: Mapping[str, str]) -> dict[str, str]:
    headers = {"Authorization": f"Bearer {settings.tokens.get()}"}
    if settings.subject:
        headers["Harness-Subject"] = settings.subject
    headers.update(trace_headers())
    headers.update(call_headers)
    return headers


def raise_for(resp: Reply, call: Call[Any]) -> None:
    try:
        body = resp.json()
    except ValueError:
        body = None
    err = error_from_response(resp.status_code, body, resp.headers.get("retry-after"))
    raise err


def should_retry(call: Call[Any], status: int | None) -> bool:
    """A transport failure (status None) or a retryable status, on a call safe to repeat."""
    if not call.retry_safe:
        return False
    return status is None or status in RETRY_STATUSES


def retry_delay(settings: Settings, attempt: int, resp: Reply | None) -> float:
    """`Retry-After` when the server sent one (at most 5 s); otherwise exponential
    backoff capped at `RETRY_CAP`, with half of it random, so workers that lost the same
    server do not come back in step."""
    if resp is not None and (ra := resp.headers.get("retry-after")):
        try:
            return min(float(ra), 5.0)
        except ValueError:
            pass
    ceiling = min(RETRY_CAP, settings.backoff * (2.0**attempt))
    return ceiling / 2 + random.uniform(0, ceiling / 2)


class RetryClock:
    """The retries of one call: bounded by `Settings.retries` and by `retry_window`
    seconds from the first attempt."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.attempt = 0
        self.started = time.monotonic()

    def next_delay(self, resp: Reply | None) -> float | None:
        """How long to wait before the next attempt, or None when no retry is left."""
        s = self.settings
        if s.retries is not None and self.attempt >= s.retries:
            return None
        delay = retry_delay(s, self.attempt, resp)
        if time.monotonic() - self.started + delay > s.retry_window:
            return None
        self.attempt += 1
        return delay


# --- Typed results -------------------------------------------------------------------


@dataclass(frozen=True)
class Fence:
    """The fence a worker believes in: sent as `Harness-Epoch` / `Harness-Lease-Generation`."""

    epoch: int
    lease_generation: int

    def headers(self) -> dict[str, str]:
        return {
            "Harness-Epoch": str(self.epoch),
            "Harness-Lease-Generation": str(self.lease_generation),
        }


@dataclass(frozen=True)
class Binding:
    binding_id: str
    environment: str
    agent_id: str
    conversation_id: str
    harness: str
    epoch: int
    lease_generation: int
    created_at_ms: int
    # Operator mode: the conversation's HarnessBinding (`namespace`, `name`, `uid`).
    harness_binding: dict[str, str] | None = None

    @property
    def fence(self) -> Fence:
        return Fence(self.epoch, self.lease_generation)

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Binding:
        return cls(
            binding_id=d["binding_id"],
            environment=d["environment"],
            agent_id=d["agent_id"],
            conversation_id=d["conversation_id"],
            harness=d["harness"],
            epoch=int(d["epoch"]),
            lease_generation=int(d["lease_generation"]),
            created_at_ms=int(d["created_at_ms"]),
            harness_binding=dict(d["harness_binding"]) if d.get("harness_binding") else None,
        )


@dataclass(frozen=True)
class Head:
    """The durable head of a binding epoch."""

    revision: int
    state_id: str
    codec: str
    content_digest: str
    size: int
    run_id: str
    durability: str
    committed_at_ms: int
    interrupt: dict[str, Any] | None
    raw: dict[str, Any]

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> Head:
        return cls(
            revision=int(d["revision"]),
            state_id=d["state_id"],
            codec=d.get("codec", ""),
            content_digest=d.get("content_digest", ""),
            size=int(d.get("size", 0)),
            run_id=d.get("run_id", ""),
            durability=d.get("durability", ""),
            committed_at_ms=int(d.get("committed_at_ms", 0)),
            interrupt=d.get("interrupt"),
            raw=dict(d),
        )


@dataclass(frozen=True)
class PendingState:
    state_id: str
    codec: str
    size: int
    content_digest: str


@dataclass(frozen=True)
class StoredObject:
    key: str
    version: int
    size: int
    content_digest: str
    updated_at_ms: int
    body: bytes | None = None

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StoredObject:
        body = d.get("body")
        return cls(
            key=d["key"],
            version=int(d["version"]),
            size=int(d["size"]),
            content_digest=d["content_digest"],
            updated_at_ms=int(d["updated_at_ms"]),
            body=base64.b64decode(body) if body is not None else None,
        )


@dataclass(frozen=True)
class ObjectPage:
    objects: list[StoredObject]
    next_before: str | None


@dataclass(frozen=True)
class StreamEntry:
    seq: int
    id: str
    body: bytes


@dataclass(frozen=True)
class Appended:
    appended: int
    duplicates: int
    last_seq: int


@dataclass(frozen=True)
class StreamInfo:
    name: str
    entries: int
    last_seq: int
    updated_at_ms: int


# --- Call builders -------------------------------------------------------------------


def _json(resp: Reply) -> Any:
    return resp.json()


def bind_call(
    agent_id: str,
    conversation_id: str,
    harness: str,
    key: str | None,
    sandbox_profile: str | None = None,
    memory_policy: str | None = None,
) -> Call[Binding]:
    """`POST /v1/bindings`. In operator mode a new conversation needs `sandbox_profile`
    (the SandboxProfile of its HarnessBinding) and may name its `memory_policy`; `serve`
    has no profiles and ignores both."""
    body: dict[str, Any] = {"agent_id": agent_id, "conversation_id": conversation_id, "harness": harness}
    if sandbox_profile is not None:
        body["sandbox_profile"] = sandbox_profile
    if memory_policy is not None:
        body["memory_policy"] = memory_policy
    return Call(
        "POST",
        "/v1/bindings",
        lambda r: Binding.from_json(r.json()),
        headers={"Idempotency-Key": key or derived_key("bind", agent_id, conversation_id)},
        json=body,
    )


def get_binding_call(binding_id: str) -> Call[Binding]:
    return Call("GET", f"/v1/bindings/{binding_id}", lambda r: Binding.from_json(r.json()))


class WorkerCalls:
    """Builders for the fenced worker calls of one binding."""

    def __init__(self, binding_id: str, fence: Fence, codec: str | None = None) -> None:
        if not binding_id:
            raise ValueError("binding_id must not be empty")
        self.binding_id = binding_id
        self.fence = fence
        self.codec = codec
        self._base = f"/v1/bindings/{binding_id}"

    def _h(self, key: str | None = None, **extra: str) -> dict[str, str]:
        h = self.fence.headers()
        if key is not None:
            h["Idempotency-Key"] = key
        h.update(extra)
        return h

    def _state_h(self, key: str | None = None, **extra: str) -> dict[str, str]:
        h = self._h(key, **extra)
        if self.codec:
            h["Harness-Codec"] = self.codec
        return h

    def load_head(self) -> Call[Head | None]:
        def parse(r: Reply) -> Head | None:
            head = r.json().get("head")
            return Head.from_json(head) if head else None

        return Call("GET", f"{self._base}/state/head", parse, headers=self._state_h())

    def read_state(self, state_id: str) -> Call[bytes]:
        return Call(
            "GET", f"{self._base}/state/bodies/{state_id}", lambda r: r.content, headers=self._state_h()
        )

    def write_pending(self, body: bytes, key: str) -> Call[PendingState]:
        def parse(r: Reply) -> PendingState:
            d = r.json()
            return PendingState(d["state_id"], d["codec"], int(d["size"]), d["content_digest"])

        return Call(
            "POST",
            f"{self._base}/state/pending",
            parse,
            headers=self._state_h(key, **{"Content-Type": "application/octet-stream"}),
            content=body,
        )

    def commit(
        self,
        state_id: str,
        expected_revision: int,
        run_id: str,
        key: str,
        terminal: Mapping[str, Any] | None = None,
        interrupt: Mapping[str, Any] | None = None,
    ) -> Call[Head]:
        body: dict[str, Any] = {
            "state_id": state_id,
            "expected_revision": expected_revision,
            "run_id": run_id,
        }
        if terminal is not None:
            body["terminal"] = dict(terminal)
        if interrupt is not None:
            body["interrupt"] = dict(interrupt)
        return Call(
            "POST",
            f"{self._base}/state/commit",
            lambda r: Head.from_json(r.json()),
            headers=self._state_h(key),
            json=body,
        )

    def commit_inline(
        self, body: bytes, expected_revision: int, run_id: str, key: str, index_key: str | None = None
    ) -> Call[Head]:
        params = {"expected_revision": str(expected_revision), "run_id": run_id}
        if index_key is not None:
            params["index_key"] = index_key
        return Call(
            "POST",
            f"{self._base}/state/commit-inline",
            lambda r: Head.from_json(r.json()),
            params=params,
            headers=self._state_h(key, **{"Content-Type": "application/octet-stream"}),
            content=body,
        )

    def mark_uncertain(self, run_id: str, reason: str, key: str) -> Call[list[dict[str, Any]]]:
        return Call(
            "POST",
            f"{self._base}/state/uncertain",
            lambda r: list(r.json()["uncertain_runs"]),
            headers=self._state_h(key),
            json={"run_id": run_id, "reason": reason},
        )

    # run ledger (docs/ledger.md)
    def append_event(self, event: Mapping[str, Any], key: str) -> Call[dict[str, Any]]:
        """Append one run-ledger event. A repeat with the same key and the same event is
        the original's replay, so the call is safe to retry."""
        return Call(
            "POST",
            f"{self._base}/runs/events",
            lambda r: dict(r.json()),
            headers=self._h(key),
            json=dict(event),
        )

    def get_effect(self, effect_key: str) -> Call[dict[str, Any] | None]:
        """One effect by its key; None when it was never attempted."""
        return Call(
            "GET",
            f"{self._base}/runs/effects",
            lambda r: dict(r.json()),
            params={"key": effect_key},
            headers=self._h(),
            none_on_404=True,
        )

    def put_object(
        self,
        key: str,
        body: bytes,
        *,
        idempotency_key: str,
        if_none_match: bool = False,
        if_match: int | None = None,
    ) -> Call[StoredObject]:
        if if_none_match and if_match is not None:
            raise Invalid("put_object takes if_none_match or if_match, not both", code="invalid")
        extra = {"Content-Type": "application/octet-stream"}
        if if_none_match:
            extra["If-None-Match"] = "*"
        if if_match is not None:
            extra["If-Match"] = f'"{if_match}"'
        return Call(
            "PUT",
            f"{self._base}/objects/item",
            lambda r: StoredObject.from_json(r.json()),
            params={"key": key},
            headers=self._h(idempotency_key, **extra),
            content=body,
        )

    def get_object(self, key: str) -> Call[StoredObject | None]:
        def parse(r: Reply) -> StoredObject | None:
            etag = r.headers.get("etag", '"0"').strip('"')
            return StoredObject(
                key=key,
                version=int(etag) if etag.isdigit() else 0,
                size=len(r.content),
                content_digest=r.headers.get("harness-content-digest", ""),
                updated_at_ms=0,
                body=r.content,
            )

        return Call(
            "GET",
            f"{self._base}/objects/item",
            parse,
            params={"key": key},
            headers=self._h(),
            none_on_404=True,
        )

    def list_objects(
        self,
        prefix: str = "",
        *,
        before: str | None = None,
        limit: int | None = None,
        with_bodies: bool = False,
    ) -> Call[ObjectPage]:
        params: dict[str, str] = {}
        if prefix:
            params["prefix"] = prefix
        if before is not None:
            params["before"] = before
        if limit is not None:
            params["limit"] = str(limit)
        if with_bodies:
            params["with_bodies"] = "true"

        def parse(r: Reply) -> ObjectPage:
            d = r.json()
            return ObjectPage(
                [StoredObject.from_json(o) for o in d["objects"]], d.get("next_before")
            )

        return Call("GET", f"{self._base}/objects", parse, params=params, headers=self._h())

    def delete_objects(self, prefix: str, key: str) -> Call[int]:
        return Call(
            "DELETE",
            f"{self._base}/objects",
            lambda r: int(r.json()["deleted"]),
            params={"prefix": prefix},
            headers=self._h(key),
        )

    def append(self, stream: str, entries: list[tuple[str, bytes]], key: str) -> Call[Appended]:
        def parse(r: Reply) -> Appended:
            d = r.json()
            return Appended(int(d["appended"]), int(d["duplicates"]), int(d["last_seq"]))

        return Call(
            "POST",
            f"{self._base}/streams/entries",
            parse,
            params={"stream": stream},
            headers=self._h(key),
            json={
                "entries": [
                    {"id": eid, "body": base64.b64encode(body).decode()} for eid, body in entries
                ]
            },
        )

    def load_entries(
        self, stream: str, *, after: int = 0, limit: int | None = None
    ) -> Call[list[StreamEntry]]:
        params = {"stream": stream, "after": str(after)}
        if limit is not None:
            params["limit"] = str(limit)

        def parse(r: Reply) -> list[StreamEntry]:
            return [
                StreamEntry(int(e["seq"]), e["id"], base64.b64decode(e["body"]))
                for e in r.json()["entries"]
            ]

        return Call("GET", f"{self._base}/streams/entries", parse, params=params, headers=self._h())

    def list_streams(self, prefix: str = "") -> Call[list[StreamInfo]]:
        params = {"prefix": prefix} if prefix else {}

        def parse(r: Reply) -> list[StreamInfo]:
            return [
                StreamInfo(s["name"], int(s["entries"]), int(s["last_seq"]), int(s["updated_at_ms"]))
                for s in r.json()["streams"]
            ]

        return Call("GET", f"{self._base}/streams", parse, params=params, headers=self._h())

    def delete_stream(self, stream: str, key: str) -> Call[int]:
        return Call(
            "DELETE",
            f"{self._base}/streams",
            lambda r: int(r.json()["deleted"]),
            params={"stream": stream},
            headers=self._h(key),
        )
