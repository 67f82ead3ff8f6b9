"""Sync and async clients for the Harness Engine data plane (docs/api.md).

`HarnessClient` / `AsyncHarnessClient` hold the connection and credentials. A worker
acts on one binding through a `Worker` / `AsyncWorker`, which carries the fence (epoch
and lease generation) it was started with on every call. The fence is never refreshed
behind the worker's back: a replaced worker must see `StaleLease` and stop.

Inside a sandbox::

    client = HarnessClient()            # HARNESS_ENGINE_ENDPOINT, HARNESS_ENGINE_TOKEN_FILE
    worker = client.worker(binding_id)  # reads the binding's current fence once

Outside one (a control-plane service, tests, `harness-engine serve`)::

    client = HarnessClient("http://127.0.0.1:8080", token="hep_...")
    binding = client.bind("agent-1", "conv-1", "deepagents")
    worker = client.worker(binding)
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import httpx

from . import _core, _wire
from ._core import (
    Appended,
    Binding,
    Call,
    Fence,
    Head,
    ObjectPage,
    PendingState,
    Settings,
    StoredObject,
    StreamEntry,
    StreamInfo,
    WorkerCalls,
    new_key,
    sha256_digest,
)
from .errors import Conflict, HarnessError, TransportError

T = TypeVar("T")

# Largest page the server returns by default (`max_page`).
PAGE = 1000


def _client_kwargs(settings: Settings) -> dict[str, Any]:
    return {
        "base_url": settings.endpoint,
        "timeout": settings.timeout,
        "limits": httpx.Limits(max_connections=64, max_keepalive_connections=32),
        # The proxy decision is `_core.proxy_for`'s, the same as the sync client's, and
        # TLS trust is the ssl module's default (which honours SSL_CERT_FILE/SSL_CERT_DIR),
        # the sync client's too: httpx's own reading of the environment is switched off.
        "proxy": settings.proxy,
        "trust_env": False,
        "verify": ssl.create_default_context(),
    }


def _ambiguous(status: int | None) -> bool:
    # 429 means "not done"; a transport failure or 5xx may have landed.
    return status != 429


def _refused(call: Call[Any], resp: _wire.Reply, ambiguous: bool) -> HarnessError:
    try:
        _core.raise_for(resp, call)
    except HarnessError as err:
        err.after_retry = ambiguous  # type: ignore[attr-defined]
        return err
    raise AssertionError("unreachable")


class HarnessClient:
    """Synchronous client. Thread-safe; share one per process."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        subject: str | None = None,
        timeout: float = 15.0,
        retries: int | None = None,
        backoff: float = 0.05,
        retry_window: float = _core.DEFAULT_RETRY_WINDOW,
    ) -> None:
        self.settings = _core.resolve_settings(
            endpoint, token, token_file, subject, timeout, retries, backoff, retry_window
        )
        self._http = _wire.Pool(
            self.settings.endpoint, self.settings.timeout, proxy=self.settings.proxy
        )

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> HarnessClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def send(self, call: Call[T]) -> T:
        s = self.settings
        ambiguous = False
        clock = _core.RetryClock(s)
        while True:
            try:
                resp = self._http.request(
                    call.method,
                    call.path,
                    call.params,
                    _core.headers_for(s, call.headers),
                    call.content,
                    call.json,
                )
            except _wire.WireError as e:
                if _core.should_retry(call, None) and (wait := clock.next_delay(None)) is not None:
                    ambiguous = ambiguous or e.sent
                    time.sleep(wait)
                    continue
                raise TransportError(f"{call.method} {call.path}: {e}") from e
            status = resp.status_code
            if status < 400:
                return call.parse(resp)
            if status == 404 and call.none_on_404:
                return None  # type: ignore[return-value]
            if _core.should_retry(call, status) and (wait := clock.next_delay(resp)) is not None:
                ambiguous = ambiguous or _ambiguous(status)
                time.sleep(wait)
                continue
            raise _refused(call, resp, ambiguous)

    def bind(
        self,
        agent_id: str,
        conversation_id: str,
        harness: str,
        *,
        idempotency_key: str | None = None,
        sandbox_profile: str | None = None,
        memory_policy: str | None = None,
    ) -> Binding:
        """Create or get the binding for (subject, agent, conversation). In operator mode
        a new conversation names its `sandbox_profile` (and optionally `memory_policy`);
        the answer's `harness_binding` is its HarnessBinding."""
        return self.send(
            _core.bind_call(
                agent_id, conversation_id, harness, idempotency_key, sandbox_profile, memory_policy
            )
        )

    def get_binding(self, binding_id: str) -> Binding:
        return self.send(_core.get_binding_call(binding_id))

    def worker(
        self, binding: Binding | str, *, fence: Fence | None = None, codec: str | None = None
    ) -> Worker:
        """A worker on `binding`, fenced by `fence` (default: the binding's current one,
        read once now)."""
        if isinstance(binding, str):
            binding = self.get_binding(binding) if fence is None else binding
        binding_id = binding if isinstance(binding, str) else binding.binding_id
        fence = fence or binding.fence  # type: ignore[union-attr]
        return Worker(self, WorkerCalls(binding_id, fence, codec))


class Worker:
    """Fenced calls on one binding (state head, native objects, native streams)."""

    def __init__(self, client: HarnessClient, calls: WorkerCalls) -> None:
        self.client = client
        self.calls = calls

    @property
    def binding_id(self) -> str:
        return self.calls.binding_id

    @property
    def fence(self) -> Fence:
        return self.calls.fence

    # state head
    def load_head(self) -> Head | None:
        return self.client.send(self.calls.load_head())

    def read_state(self, state_id: str) -> bytes:
        return self.client.send(self.calls.read_state(state_id))

    def write_pending(self, body: bytes, *, idempotency_key: str | None = None) -> PendingState:
        return self.client.send(self.calls.write_pending(body, idempotency_key or new_key("ps")))

    def commit(
        self,
        state_id: str,
        expected_revision: int,
        run_id: str,
        *,
        terminal: Mapping[str, Any] | None = None,
        interrupt: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Head:
        return self.client.send(
            self.calls.commit(
                state_id,
                expected_revision,
                run_id,
                idempotency_key or new_key("commit"),
                terminal,
                interrupt,
            )
        )

    def commit_inline(
        self,
        body: bytes,
        expected_revision: int,
        run_id: str,
        *,
        index_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> Head:
        """Write `body` as pending state and commit it in one call (one store transaction
        on SQLite); with `index_key`, also store it as that native object. The
        idempotency key names the pending state, as in `write_pending`."""
        return self.client.send(
            self.calls.commit_inline(
                body, expected_revision, run_id, idempotency_key or new_key("ps"), index_key
            )
        )

    def mark_uncertain(
        self, run_id: str, reason: str, *, idempotency_key: str | None = None
    ) -> list[dict[str, Any]]:
        return self.client.send(
            self.calls.mark_uncertain(run_id, reason, idempotency_key or new_key("uncertain"))
        )

    # run ledger
    def append_event(
        self, event: Mapping[str, Any], *, idempotency_key: str | None = None
    ) -> dict[str, Any]:
        """Append a run-ledger event (docs/ledger.md); `{event, replayed, effect, ...}`."""
        return self.client.send(self.calls.append_event(event, idempotency_key or new_key("ev")))

    def get_effect(self, effect_key: str) -> dict[str, Any] | None:
        return self.client.send(self.calls.get_effect(effect_key))

    # native objects
    def put_object(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: int | None = None,
        idempotency_key: str | None = None,
    ) -> StoredObject:
        """Put an object. `if_none_match`: create only; `if_match`: replace that version.

        A conditional put retried after an ambiguous failure may find its own first
        attempt landed (409 `conflict`); it then reads the object back and succeeds if
        the stored body is the one it sent.
        """
        call = self.calls.put_object(
            key,
            body,
            idempotency_key=idempotency_key or new_key("put"),
            if_none_match=if_none_match,
            if_match=if_match,
        )
        try:
            return self.client.send(call)
        except Conflict as err:
            if getattr(err, "after_retry", False):
                got = self.get_object(key)
                if got is not None and got.content_digest == sha256_digest(body):
                    return got
            raise

    def get_object(self, key: str) -> StoredObject | None:
        return self.client.send(self.calls.get_object(key))

    def list_objects(
        self,
        prefix: str = "",
        *,
        before: str | None = None,
        limit: int | None = None,
        with_bodies: bool = False,
    ) -> ObjectPage:
        return self.client.send(
            self.calls.list_objects(prefix, before=before, limit=limit, with_bodies=with_bodies)
        )

    def iter_objects(
        self, prefix: str = "", *, before: str | None = None, with_bodies: bool = False, page: int = PAGE
    ) -> Iterator[StoredObject]:
        """Every object under `prefix`, keys descending, page by page."""
        while True:
            got = self.list_objects(prefix, before=before, limit=page, with_bodies=with_bodies)
            yield from got.objects
            if not got.next_before:
                return
            before = got.next_before

    def delete_objects(self, prefix: str, *, idempotency_key: str | None = None) -> int:
        return self.client.send(self.calls.delete_objects(prefix, idempotency_key or new_key("del")))

    # native streams
    def append(
        self, stream: str, entries: Sequence[tuple[str, bytes]], *, idempotency_key: str | None = None
    ) -> Appended:
        """Append `(entry_id, body)` pairs in order; ids the stream holds are skipped."""
        return self.client.send(
            self.calls.append(stream, list(entries), idempotency_key or new_key("append"))
        )

    def load_entries(self, stream: str, *, after: int = 0, limit: int | None = None) -> list[StreamEntry]:
        return self.client.send(self.calls.load_entries(stream, after=after, limit=limit))

    def load_all(self, stream: str, *, after: int = 0) -> list[StreamEntry]:
        out: list[StreamEntry] = []
        while True:
            page = self.load_entries(stream, after=after, limit=PAGE)
            out.extend(page)
            if len(page) < PAGE:
                return out
            after = page[-1].seq

    def list_streams(self, prefix: str = "") -> list[StreamInfo]:
        return self.client.send(self.calls.list_streams(prefix))

    def delete_stream(self, stream: str, *, idempotency_key: str | None = None) -> int:
        """Delete `stream` and every sub-stream under `stream/`."""
        return self.client.send(self.calls.delete_stream(stream, idempotency_key or new_key("del")))


class AsyncHarnessClient:
    """Asynchronous client (asyncio). Share one per event loop."""

    def __init__(
        self,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        subject: str | None = None,
        timeout: float = 15.0,
        retries: int | None = None,
        backoff: float = 0.05,
        retry_window: float = _core.DEFAULT_RETRY_WINDOW,
    ) -> None:
        self.settings = _core.resolve_settings(
            endpoint, token, token_file, subject, timeout, retries, backoff, retry_window
        )
        self._http = httpx.AsyncClient(**_client_kwargs(self.settings))

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncHarnessClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def send(self, call: Call[T]) -> T:
        s = self.settings
        ambiguous = False
        clock = _core.RetryClock(s)
        while True:
            try:
                resp = await self._http.request(
                    call.method,
                    call.path,
                    params=call.params,
                    headers=_core.headers_for(s, call.headers),
                    content=call.content,
                    json=call.json,
                )
            except httpx.TransportError as e:
                if _core.should_retry(call, None) and (wait := clock.next_delay(None)) is not None:
                    ambiguous = ambiguous or not isinstance(e, httpx.ConnectError)
                    await asyncio.sleep(wait)
                    continue
                raise TransportError(f"{call.method} {call.path}: {e!r}") from e
            status = resp.status_code
            if status < 400:
                return call.parse(resp)
            if status == 404 and call.none_on_404:
                return None  # type: ignore[return-value]
            if _core.should_retry(call, status) and (wait := clock.next_delay(resp)) is not None:
                ambiguous = ambiguous or _ambiguous(status)
                await asyncio.sleep(wait)
                continue
            raise _refused(call, resp, ambiguous)

    async def bind(
        self,
        agent_id: str,
        conversation_id: str,
        harness: str,
        *,
        idempotency_key: str | None = None,
        sandbox_profile: str | None = None,
        memory_policy: str | None = None,
    ) -> Binding:
        return await self.send(
            _core.bind_call(
                agent_id, conversation_id, harness, idempotency_key, sandbox_profile, memory_policy
            )
        )

    async def get_binding(self, binding_id: str) -> Binding:
        return await self.send(_core.get_binding_call(binding_id))

    async def worker(
        self, binding: Binding | str, *, fence: Fence | None = None, codec: str | None = None
    ) -> AsyncWorker:
        if isinstance(binding, str) and fence is None:
            binding = await self.get_binding(binding)
        binding_id = binding if isinstance(binding, str) else binding.binding_id
        fence = fence or binding.fence  # type: ignore[union-attr]
        return AsyncWorker(self, WorkerCalls(binding_id, fence, codec))


class AsyncWorker:
    """Async twin of `Worker`."""

    def __init__(self, client: AsyncHarnessClient, calls: WorkerCalls) -> None:
        self.client = client
        self.calls = calls

    @property
    def binding_id(self) -> str:
        return self.calls.binding_id

    @property
    def fence(self) -> Fence:
        return self.calls.fence

    async def load_head(self) -> Head | None:
        return await self.client.send(self.calls.load_head())

    async def read_state(self, state_id: str) -> bytes:
        return await self.client.send(self.calls.read_state(state_id))

    async def write_pending(self, body: bytes, *, idempotency_key: str | None = None) -> PendingState:
        return await self.client.send(self.calls.write_pending(body, idempotency_key or new_key("ps")))

    async def commit(
        self,
        state_id: str,
        expected_revision: int,
        run_id: str,
        *,
        terminal: Mapping[str, Any] | None = None,
        interrupt: Mapping[str, Any] | None = None,
        idempotency_key: str | None = None,
    ) -> Head:
        return await self.client.send(
            self.calls.commit(
                state_id,
                expected_revision,
                run_id,
                idempotency_key or new_key("commit"),
                terminal,
                interrupt,
            )
        )

    async def commit_inline(
        self,
        body: bytes,
        expected_revision: int,
        run_id: str,
        *,
        index_key: str | None = None,
        idempotency_key: str | None = None,
    ) -> Head:
        return await self.client.send(
            self.calls.commit_inline(
                body, expected_revision, run_id, idempotency_key or new_key("ps"), index_key
            )
        )

    async def mark_uncertain(
        self, run_id: str, reason: str, *, idempotency_key: str | None = None
    ) -> list[dict[str, Any]]:
        return await self.client.send(
            self.calls.mark_uncertain(run_id, reason, idempotency_key or new_key("uncertain"))
        )

    async def put_object(
        self,
        key: str,
        body: bytes,
        *,
        if_none_match: bool = False,
        if_match: int | None = None,
        idempotency_key: str | None = None,
    ) -> StoredObject:
        call = self.calls.put_object(
            key,
            body,
            idempotency_key=idempotency_key or new_key("put"),
            if_none_match=if_none_match,
            if_match=if_match,
        )
        try:
            return await self.client.send(call)
        except Conflict as err:
            if getattr(err, "after_retry", False):
                got = await self.get_object(key)
                if got is not None and got.content_digest == sha256_digest(body):
                    return got
            raise

    async def get_object(self, key: str) -> StoredObject | None:
        return await self.client.send(self.calls.get_object(key))

    async def list_objects(
        self,
        prefix: str = "",
        *,
        before: str | None = None,
        limit: int | None = None,
        with_bodies: bool = False,
    ) -> ObjectPage:
        return await self.client.send(
            self.calls.list_objects(prefix, before=before, limit=limit, with_bodies=with_bodies)
        )

    async def iter_objects(
        self, prefix: str = "", *, before: str | None = None, with_bodies: bool = False, page: int = PAGE
    ) -> AsyncIterator[StoredObject]:
        while True:
            got = await self.list_objects(prefix, before=before, limit=page, with_bodies=with_bodies)
            for o in got.objects:
                yield o
            if not got.next_before:
                return
            before = got.next_before

    async def delete_objects(self, prefix: str, *, idempotency_key: str | None = None) -> int:
        return await self.client.send(
            self.calls.delete_objects(prefix, idempotency_key or new_key("del"))
        )

    async def append(
        self, stream: str, entries: Sequence[tuple[str, bytes]], *, idempotency_key: str | None = None
    ) -> Appended:
        return await self.client.send(
            self.calls.append(stream, list(entries), idempotency_key or new_key("append"))
        )

    async def load_entries(
        self, stream: str, *, after: int = 0, limit: int | None = None
    ) -> list[StreamEntry]:
        return await self.client.send(self.calls.load_entries(stream, after=after, limit=limit))

    async def load_all(self, stream: str, *, after: int = 0) -> list[StreamEntry]:
        out: list[StreamEntry] = []
        while True:
            page = await self.load_entries(stream, after=after, limit=PAGE)
            out.extend(page)
            if len(page) < PAGE:
                return out
            after = page[-1].seq

    async def list_streams(self, prefix: str = "") -> list[StreamInfo]:
        return await self.client.send(self.calls.list_streams(prefix))

    async def delete_stream(self, stream: str, *, idempotency_key: str | None = None) -> int:
        return await self.client.send(
            self.calls.delete_stream(stream, idempotency_key or new_key("del"))
        )
