"""LangGraph `BaseStore` on the Harness Engine memory API (`/v1/memory`, docs/memory.md).

An item ``(namespace, key)`` is the memory record whose key is the namespace labels and
the item key joined by ``/`` (each part percent-encoded, dots included, so a label can
never form an empty, ``.`` or ``..`` segment the memory API refuses), in one memory
scope (``user`` by default). Its value is stored as ``application/json`` content.

What the memory API adds, and the adapter does not hide:

- every write goes through the write pipeline: secrets are redacted and content that
  tries to widen authority is refused (`ForbiddenScope`), so what `get` returns can
  differ from what was put, and a sensitive value may wait for approval (until then
  `get` answers ``None`` and search does not find it);
- writes are compare-and-set on the record's revision: `put` and `delete` read the
  revision the server reports and retry on `RevisionConflict` a bounded number of
  times, so a concurrent writer is never silently overwritten in between;
- search is the memory API's ranked, namespace-isolated search: it needs a query, and
  the namespace prefix and `filter` narrow its answer here. Listing without a query and
  `list_namespaces` have no memory API counterpart and raise `NotImplementedError`.

Memory calls carry `Harness-Binding` (the binding whose memory context is used) and the
worker's fence, like every worker call.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any
from urllib.parse import quote, unquote

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from .._core import Call, derived_key, new_key
from .._wire import Reply
from ..client import AsyncWorker, Worker
from ..errors import RevisionConflict

_CAS_ATTEMPTS = 5


def _seg(part: str) -> str:
    return quote(part, safe="").replace(".", "%2E")


def memory_key(namespace: tuple[str, ...], key: str) -> str:
    if not namespace:
        raise ValueError("a LangGraph store namespace needs at least one label")
    return "/".join(_seg(p) for p in (*namespace, key))


def _split(mkey: str) -> tuple[tuple[str, ...], str]:
    parts = [unquote(p) for p in mkey.split("/")]
    return tuple(parts[:-1]), parts[-1]


def _ts(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=timezone.utc)


def _item(record: Mapping[str, Any], score: float | None = None) -> Item:
    namespace, key = _split(record["key"])
    try:
        value = json.loads(record["content"])
    except ValueError:
        value = {"content": record["content"]}
    if not isinstance(value, dict):
        value = {"value": value}
    created, updated = _ts(int(record["created_at_ms"])), _ts(int(record["updated_at_ms"]))
    if score is None:
        return Item(value=value, key=key, namespace=namespace, created_at=created, updated_at=updated)
    return SearchItem(
        value=value, key=key, namespace=namespace, created_at=created, updated_at=updated, score=score
    )


def _matches(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    return not filter or all(value.get(k) == v for k, v in filter.items())


class _MemoryCalls:
    """Builders for `/v1/memory` calls in one binding's memory context."""

    def __init__(self, worker: Worker | AsyncWorker, scope: str, kind: str) -> None:
        self.binding_id = worker.binding_id
        self.fence = worker.fence
        self.scope = scope
        self.kind = kind

    def _h(self, key: str | None = None) -> dict[str, str]:
        h = {"Harness-Binding": self.binding_id, **self.fence.headers()}
        if key is not None:
            h["Idempotency-Key"] = key
        return h

    def get(self, mkey: str) -> Call[dict[str, Any] | None]:
        return Call(
            "GET",
            f"/v1/memory/{self.scope}/records",
            lambda r: dict(r.json()),
            params={"key": mkey},
            headers=self._h(),
            none_on_404=True,
        )

    def put(self, mkey: str, value: Mapping[str, Any], expected: int) -> Call[dict[str, Any]]:
        content = json.dumps(value, separators=(",", ":"), sort_keys=True)
        body = {
            "key": mkey,
            "kind": self.kind,
            "media_type": "application/json",
            "content": content,
            "expected_revision": expected,
        }
        return Call(
            "PUT",
            f"/v1/memory/{self.scope}/records",
            lambda r: dict(r.json()["record"]),
            headers=self._h(derived_key("mem-put", mkey, str(expected), content)),
            json=body,
        )

    def delete(self, mkey: str, expected: int) -> Call[dict[str, Any] | None]:
        return Call(
            "DELETE",
            f"/v1/memory/{self.scope}/records",
            lambda r: dict(r.json()),
            params={"key": mkey, "expected_revision": str(expected)},
            headers=self._h(derived_key("mem-del", mkey, str(expected))),
            none_on_404=True,
        )

    def search(self, query: str, limit: int) -> Call[list[dict[str, Any]]]:
        def parse(r: Reply) -> list[dict[str, Any]]:
            return list(r.json()["results"])

        return Call(
            "POST",
            "/v1/memory/search",
            parse,
            headers=self._h(new_key("mem-search")),
            json={"query": query, "scopes": [self.scope], "limit": limit},
        )


def _revision_of(err: RevisionConflict) -> int:
    actual = err.actual
    if actual is None:
        raise err
    return actual


class HarnessStore(BaseStore):
    """A LangGraph long-term memory store backed by Harness Engine memory.

    ``HarnessStore(client.worker(binding_id))`` for sync graphs,
    ``HarnessStore(async_worker=await aclient.worker(binding_id))`` for async ones.
    """

    def __init__(
        self,
        worker: Worker | None = None,
        *,
        async_worker: AsyncWorker | None = None,
        scope: str = "user",
        kind: str = "semantic",
    ) -> None:
        if worker is None and async_worker is None:
            raise ValueError("HarnessStore needs a worker, an async_worker, or both")
        if scope not in ("user", "agent", "organization"):
            raise ValueError(f"scope must be user, agent or organization, not {scope!r}")
        self.worker = worker
        self.async_worker = async_worker
        self._calls = _MemoryCalls(worker or async_worker, scope, kind)  # type: ignore[arg-type]
        self._revisions: dict[str, int] = {}

    # --- sync ----------------------------------------------------------------------

    def _w(self) -> Worker:
        if self.worker is None:
            raise RuntimeError("this HarnessStore has no sync worker; use the async API")
        return self.worker

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [self._one(op) for op in ops]

    def _one(self, op: Op) -> Result:
        c = self._w().client
        if isinstance(op, GetOp):
            mkey = memory_key(op.namespace, op.key)
            record = c.send(self._calls.get(mkey))
            if record is None:
                return None
            self._revisions[mkey] = int(record["revision"])
            return _item(record)
        if isinstance(op, PutOp):
            mkey = memory_key(op.namespace, op.key)
            expected = self._revisions.get(mkey, 0)
            for _ in range(_CAS_ATTEMPTS):
                try:
                    if op.value is None:
                        if expected == 0:
                            record = c.send(self._calls.get(mkey))
                            if record is None:
                                return None
                            expected = int(record["revision"])
                        c.send(self._calls.delete(mkey, expected))
                        self._revisions.pop(mkey, None)
                    else:
                        record = c.send(self._calls.put(mkey, op.value, expected))
                        self._revisions[mkey] = int(record["revision"])
                    return None
                except RevisionConflict as err:
                    expected = _revision_of(err)
            raise RevisionConflict(f"memory {mkey} kept changing under the write", code="revision_conflict")
        if isinstance(op, SearchOp):
            return self._search(op, lambda q, n: c.send(self._calls.search(q, n)))
        if isinstance(op, ListNamespacesOp):
            raise NotImplementedError(
                "the memory API has no namespace listing; HarnessStore supports get, put, delete and search with a query"
            )
        raise TypeError(f"unknown store operation {op!r}")

    def _search(self, op: SearchOp, run: Any) -> list[SearchItem]:
        if not op.query:
            raise NotImplementedError(
                "the memory API searches by query; listing a namespace without one is not supported"
            )
        prefix = "".join(_seg(p) + "/" for p in op.namespace_prefix)
        hits = run(op.query, op.offset + op.limit)
        out: list[SearchItem] = []
        for hit in hits:
            record = hit["record"]
            if prefix and not record["key"].startswith(prefix):
                continue
            item = _item(record, float(hit["score"]))
            if _matches(item.value, op.filter):
                out.append(item)  # type: ignore[arg-type]
        return out[op.offset : op.offset + op.limit]

    # --- async ---------------------------------------------------------------------

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return [await self._aone(op) for op in ops]

    async def _aone(self, op: Op) -> Result:
        if self.async_worker is None:
            raise RuntimeError("this HarnessStore has no async worker; use the sync API")
        c = self.async_worker.client
        if isinstance(op, GetOp):
            mkey = memory_key(op.namespace, op.key)
            record = await c.send(self._calls.get(mkey))
            if record is None:
                return None
            self._revisions[mkey] = int(record["revision"])
            return _item(record)
        if isinstance(op, PutOp):
            mkey = memory_key(op.namespace, op.key)
            expected = self._revisions.get(mkey, 0)
            for _ in range(_CAS_ATTEMPTS):
                try:
                    if op.value is None:
                        if expected == 0:
                            record = await c.send(self._calls.get(mkey))
                            if record is None:
                                return None
                            expected = int(record["revision"])
                        await c.send(self._calls.delete(mkey, expected))
                        self._revisions.pop(mkey, None)
                    else:
                        record = await c.send(self._calls.put(mkey, op.value, expected))
                        self._revisions[mkey] = int(record["revision"])
                    return None
                except RevisionConflict as err:
                    expected = _revision_of(err)
            raise RevisionConflict(f"memory {mkey} kept changing under the write", code="revision_conflict")
        if isinstance(op, SearchOp):
            if not op.query:
                return self._search(op, None)
            hits = await c.send(self._calls.search(op.query, op.offset + op.limit))
            return self._search(op, lambda q, n: hits)
        if isinstance(op, ListNamespacesOp):
            raise NotImplementedError(
                "the memory API has no namespace listing; HarnessStore supports get, put, delete and search with a query"
            )
        raise TypeError(f"unknown store operation {op!r}")


__all__ = ["HarnessStore", "memory_key"]
