"""LangGraph `BaseCheckpointSaver` on Harness Engine native objects and the head commit.

Layout inside one binding (the server derives the binding's scope; thread ids live
under it):

- checkpoint ``lg/<thread>/n<ns>/<checkpoint_id>``: a native object holding one framed
  record (the serialized checkpoint, its metadata, its parent id). Checkpoint ids are
  time-ordered (uuid6), so the server's descending key order is newest first.
- pending writes of a checkpoint: the native stream ``lgw/<thread>/n<ns>/<checkpoint_id>``,
  one entry per write. A regular write's entry id is ``<task_id>:<idx>``, so a repeated
  write is skipped by the server (first write wins, as LangGraph wants); a special write
  (negative index from `WRITES_IDX_MAP`: error, scheduled, interrupt, resume) carries
  a digest of its value in the id and the newest one wins when read back.
- the head: every `put` writes the record as native state and commits it with a
  compare-and-set on the durable revision the saver last saw (spec 000, commit
  protocol, steps 3 and 4), storing the object in the same call
  (`state/commit-inline?index_key=...`, one store transaction on SQLite; the object refers
  to the committed state, so the body is stored once). Two writers on one binding therefore
  cannot both extend it: the second gets `RevisionConflict`, a replaced worker gets
  `StaleLease`, and neither leaves a checkpoint behind. Maintenance calls (delete,
  copy, prune) commit a small record too, so the head is the one linearization point.

An effect review (an `interrupt()` whose value is a mapping with `type:
"effect_review"`, as `effect_tool` raises when a person must decide an effect) is also
committed as the binding's pending interrupt, so the control plane finds it at
`GET .../interrupt` and answers it with the interrupt protocol; the head of that commit
is a small record naming the checkpoint. Other interrupts stay LangGraph's own.

A backend that cannot do the three writes in one transaction (MongoDB) runs them in
order, so a worker can die after the commit and before the object write; the next saver
on the binding then finds the head's checkpoint missing from the index and writes it
back from the committed body (`_repair`).
"""

from __future__ import annotations

import asyncio
import json
import random
import struct
import threading
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from typing import Any
from urllib.parse import quote, unquote

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)

from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.checkpoint.serde.types import INTERRUPT

from .._core import Head, derived_key, sha256_digest
from ..client import AsyncHarnessClient, AsyncWorker, HarnessClient, Worker
from ..errors import HarnessError

CODEC = "langgraph-checkpoint-v1"
_List = list  # the saver has a method named `list`
_LEN = struct.Struct(">I")


def _q(part: str) -> str:
    return quote(part, safe="")


def thread_prefix(thread_id: str) -> str:
    return f"lg/{_q(thread_id)}/"


def ns_prefix(thread_id: str, ns: str) -> str:
    return f"lg/{_q(thread_id)}/n{_q(ns)}/"


def object_key(thread_id: str, ns: str, checkpoint_id: str) -> str:
    return ns_prefix(thread_id, ns) + _q(checkpoint_id)


def writes_stream(thread_id: str, ns: str, checkpoint_id: str) -> str:
    return f"lgw/{_q(thread_id)}/n{_q(ns)}/{_q(checkpoint_id)}"


def _frame(header: Mapping[str, Any], *parts: bytes) -> bytes:
    head = json.dumps(header, separators=(",", ":")).encode()
    return _LEN.pack(len(head)) + head + b"".join(parts)


def _unframe(body: bytes) -> tuple[dict[str, Any], memoryview]:
    (n,) = _LEN.unpack_from(body, 0)
    header = json.loads(body[4 : 4 + n])
    return header, memoryview(body)[4 + n :]


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class _Record:
    """A decoded checkpoint object (metadata decoded lazily: filters need it, most reads
    do too)."""

    def __init__(self, saver: HarnessCheckpointSaver, body: bytes) -> None:
        header, rest = _unframe(body)
        self.header = header
        self.thread_id: str = header["thread_id"]
        self.ns: str = header["checkpoint_ns"]
        self.checkpoint_id: str = header["checkpoint_id"]
        self.parent_id: str | None = header.get("parent_checkpoint_id")
        ct, cl = header["checkpoint"]
        mt, ml = header["metadata"]
        self._cp = (ct, bytes(rest[:cl]))
        self._md = (mt, bytes(rest[cl : cl + ml]))
        self._serde = saver.serde
        self._metadata: CheckpointMetadata | None = None

    @property
    def metadata(self) -> CheckpointMetadata:
        if self._metadata is None:
            self._metadata = self._serde.loads_typed(self._md)
        return self._metadata

    def checkpoint(self) -> Checkpoint:
        checkpoint: Checkpoint = self._serde.loads_typed(self._cp)
        return checkpoint

    def tuple(self, writes: _List[tuple[str, str, Any]]) -> CheckpointTuple:
        return CheckpointTuple(
            config=_config(self.thread_id, self.ns, self.checkpoint_id),
            checkpoint=self.checkpoint(),
            metadata=self.metadata,
            parent_config=(
                _config(self.thread_id, self.ns, self.parent_id) if self.parent_id else None
            ),
            pending_writes=writes,
        )

    def retarget(self, thread_id: str) -> bytes:
        header = dict(self.header, thread_id=thread_id)
        return _frame(header, self._cp[1], self._md[1])


def _matches(metadata: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    return not filter or all(metadata.get(k) == v for k, v in filter.items())


class HarnessCheckpointSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer whose state lives in Harness Engine.

    Give it a sync `Worker` (for `graph.invoke`), an `AsyncWorker` (for `ainvoke`,
    `astream`), or both; `connect()` builds both from an endpoint and a binding. Each
    saver is one writer: it commits on the revision it last saw, so a second live
    writer on the same binding is refused instead of forking the history.
    """

    def __init__(
        self,
        worker: Worker | None = None,
        *,
        async_worker: AsyncWorker | None = None,
        serde: SerializerProtocol | None = None,
    ) -> None:
        super().__init__(serde=serde)
        if worker is None and async_worker is None:
            raise ValueError("HarnessCheckpointSaver needs a worker, an async_worker, or both")
        self.worker = worker
        self.async_worker = async_worker
        self._revision: int | None = None
        self._head: Head | None = None
        self._lock = threading.Lock()
        self._alock: asyncio.Lock | None = None

    @classmethod
    def connect(
        cls,
        binding_id: str,
        endpoint: str | None = None,
        *,
        token: str | None = None,
        token_file: str | None = None,
        serde: SerializerProtocol | None = None,
    ) -> HarnessCheckpointSaver:
        """Sync and async workers on `binding_id`, fenced by its current lease."""
        client = HarnessClient(endpoint, token=token, token_file=token_file)
        worker = client.worker(binding_id, codec=CODEC)
        aclient = AsyncHarnessClient(endpoint, token=token, token_file=token_file)
        # The same binding and fence for both: one writer, two calling conventions.
        return cls(worker, async_worker=AsyncWorker(aclient, worker.calls), serde=serde)

    # --- helpers -------------------------------------------------------------------

    def _w(self) -> Worker:
        if self.worker is None:
            raise RuntimeError(
                "this HarnessCheckpointSaver has no sync worker: use the async API "
                "(ainvoke/astream) or pass worker=..."
            )
        return self.worker

    def _aw(self) -> AsyncWorker:
        if self.async_worker is None:
            raise RuntimeError(
                "this HarnessCheckpointSaver has no async worker: use the sync API "
                "(invoke/stream) or pass async_worker=..."
            )
        return self.async_worker

    def _alock_get(self) -> asyncio.Lock:
        if self._alock is None:
            self._alock = asyncio.Lock()
        return self._alock

    @property
    def revision(self) -> int | None:
        """The durable revision this saver last committed or loaded."""
        return self._revision

    def _record(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata) -> tuple[str, str, str, bytes]:
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns", ""))
        ct, cb = self.serde.dumps_typed(checkpoint)
        mt, mb = self.serde.dumps_typed(get_checkpoint_metadata(config, metadata))
        header = {
            "kind": "checkpoint",
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint["id"],
            "parent_checkpoint_id": conf.get("checkpoint_id"),
            "checkpoint": [ct, len(cb)],
            "metadata": [mt, len(mb)],
        }
        return thread_id, ns, checkpoint["id"], _frame(header, cb, mb)

    def _run_id(self, metadata: Mapping[str, Any], fallback: str) -> str:
        run_id = metadata.get("run_id")
        return str(run_id) if run_id else f"lg-{fallback}"

    def _write_entries(
        self, writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
    ) -> _List[tuple[str, bytes]]:
        entries: _List[tuple[str, bytes]] = []
        for idx, (channel, value) in enumerate(writes):
            widx = WRITES_IDX_MAP.get(channel, idx)
            vt, vb = self.serde.dumps_typed(value)
            header = {"task_id": task_id, "idx": widx, "channel": channel, "type": vt, "path": task_path}
            body = _frame(header, vb)
            if widx >= 0:
                entry_id = f"{task_id}:{widx}"
            else:
                entry_id = f"{task_id}:{widx}:{sha256_digest(body)[7:23]}"
            entries.append((entry_id, body))
        return entries

    def _decode_writes(self, entries: Sequence[Any]) -> _List[tuple[str, str, Any]]:
        latest: dict[tuple[str, int], tuple[dict[str, Any], bytes]] = {}
        for e in entries:  # seq order: a later special write replaces an earlier one
            header, rest = _unframe(e.body)
            latest[(header["task_id"], header["idx"])] = (header, bytes(rest))
        ordered = sorted(
            latest.values(), key=lambda hv: (hv[0].get("path", ""), hv[0]["task_id"], hv[0]["idx"])
        )
        return [
            (h["task_id"], h["channel"], self.serde.loads_typed((h["type"], v))) for h, v in ordered
        ]

    @staticmethod
    def _effect_review(writes: Sequence[tuple[str, Any]]) -> dict[str, Any] | None:
        """The server-side interrupt for an effect review among `writes`, if any."""
        for channel, value in writes:
            if channel != INTERRUPT:
                continue
            for item in value if isinstance(value, (list, tuple)) else [value]:
                request = getattr(item, "value", None)
                if isinstance(request, Mapping) and request.get("type") == "effect_review":
                    body = {k: v for k, v in request.items() if k not in ("type", "allowed_decisions")}
                    return {
                        "interrupt_id": str(getattr(item, "id", "") or body["idempotency_key"]),
                        "type": "effect_review",
                        "allowed_decisions": list(request.get("allowed_decisions") or ["confirmed", "refused"]),
                        "body": body,
                    }
        return None

    def _interrupt_record(self, config: RunnableConfig, interrupt: Mapping[str, Any]) -> tuple[bytes, str]:
        """The head committed with an effect review (a small record naming the
        checkpoint), and its run id."""
        conf = config["configurable"]
        body = self._maintenance(
            "interrupt",
            thread_id=str(conf["thread_id"]),
            checkpoint_ns=str(conf.get("checkpoint_ns", "")),
            checkpoint_id=conf.get("checkpoint_id"),
            interrupt_id=interrupt["interrupt_id"],
        )
        return body, self._run_id(conf, interrupt["interrupt_id"])

    def _commit_interrupt(self, w: Worker, config: RunnableConfig, interrupt: dict[str, Any]) -> None:
        body, run_id = self._interrupt_record(config, interrupt)
        with self._lock:
            expected = self._sync_revision(w)
            # One key per occurrence: the same review raised again (a worker re-running
            # the interrupted step) is a new commit on the revision it starts from.
            ident = derived_key("lgi", interrupt["interrupt_id"], str(expected), sha256_digest(body))
            pending = w.write_pending(body, idempotency_key=ident)
            head = w.commit(
                pending.state_id,
                expected,
                run_id,
                interrupt=interrupt,
                idempotency_key=ident,
            )
            self._revision = head.revision
            self._head = head

    async def _acommit_interrupt(
        self, w: AsyncWorker, config: RunnableConfig, interrupt: dict[str, Any]
    ) -> None:
        body, run_id = self._interrupt_record(config, interrupt)
        async with self._alock_get():
            expected = await self._async_revision(w)
            # One key per occurrence: the same review raised again (a worker re-running
            # the interrupted step) is a new commit on the revision it starts from.
            ident = derived_key("lgi", interrupt["interrupt_id"], str(expected), sha256_digest(body))
            pending = await w.write_pending(body, idempotency_key=ident)
            head = await w.commit(
                pending.state_id,
                expected,
                run_id,
                interrupt=interrupt,
                idempotency_key=ident,
            )
            self._revision = head.revision
            self._head = head

    @staticmethod
    def _maintenance(op: str, **fields: Any) -> bytes:
        return _frame({"kind": "maintenance", "op": op, **fields})

    def close(self) -> None:
        """Nothing is buffered; kept so the saver can be closed like LangGraph's own."""

    # --- the head ------------------------------------------------------------------

    def load_head(self) -> Head | None:
        """Load the durable head and pin its revision as the one this saver extends
        (spec 000 commit protocol, step 1). Called lazily by the first write; call it
        when the worker starts to fence out any writer that commits after that."""
        w = self._w()
        with self._lock:
            self._revision = None
            self._sync_revision(w)
        return self._head

    async def aload_head(self) -> Head | None:
        w = self._aw()
        async with self._alock_get():
            self._revision = None
            await self._async_revision(w)
        return self._head

    # --- sync API ------------------------------------------------------------------

    def _sync_revision(self, w: Worker) -> int:
        if self._revision is None:
            head = w.load_head()
            self._head = head
            self._revision = head.revision if head else 0
            if head is not None:
                self._repair(w, head.state_id)
        return self._revision

    def _repair(self, w: Worker, state_id: str) -> None:
        body = w.read_state(state_id)
        header, _ = _unframe(body)
        if header.get("kind") != "checkpoint":
            return
        key = object_key(header["thread_id"], header["checkpoint_ns"], header["checkpoint_id"])
        if w.get_object(key) is None:
            w.put_object(key, body, idempotency_key=derived_key("lgo", key, sha256_digest(body)))

    def _commit(self, w: Worker, body: bytes, run_id: str, ident: str, index: str | None = None) -> None:
        with self._lock:
            expected = self._sync_revision(w)
            head = w.commit_inline(
                body,
                expected,
                run_id,
                index_key=index,
                idempotency_key=derived_key("lgp", ident, sha256_digest(body)),
            )
            self._revision = head.revision
            self._head = head

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        w = self._w()
        thread_id, ns, cid, body = self._record(config, checkpoint, metadata)
        key = object_key(thread_id, ns, cid)
        self._commit(w, body, self._run_id(metadata, cid), key, index=key)
        return _config(thread_id, ns, cid)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        conf = config["configurable"]
        stream = writes_stream(str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), conf["checkpoint_id"])
        entries = self._write_entries(writes, task_id, task_path)
        self._w().append(stream, entries, idempotency_key=derived_key("lgw", stream, *(f"{e}={sha256_digest(b)}" for e, b in entries)))
        review = self._effect_review(writes)
        if review is not None:
            self._commit_interrupt(self._w(), config, review)

    def _writes(self, w: Worker, rec: _Record) -> _List[tuple[str, str, Any]]:
        return self._decode_writes(w.load_all(writes_stream(rec.thread_id, rec.ns, rec.checkpoint_id)))

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        w = self._w()
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns", ""))
        if cid := get_checkpoint_id(config):
            obj = w.get_object(object_key(thread_id, ns, cid))
            body = obj.body if obj else None
        else:
            page = w.list_objects(ns_prefix(thread_id, ns), limit=1, with_bodies=True)
            body = page.objects[0].body if page.objects else None
        if body is None:
            return None
        rec = _Record(self, body)
        return rec.tuple(self._writes(w, rec))

    def _prefix_for(self, config: RunnableConfig | None) -> tuple[str, str | None]:
        if config is None:
            return "lg/", None
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        if "checkpoint_ns" in conf and conf["checkpoint_ns"] is not None:
            return ns_prefix(thread_id, str(conf["checkpoint_ns"])), get_checkpoint_id(config)
        return thread_prefix(thread_id), get_checkpoint_id(config)

    def _select(
        self,
        records: Iterator[_Record],
        only_id: str | None,
        filter: dict[str, Any] | None,
        before: RunnableConfig | None,
        limit: int | None,
    ) -> Iterator[_Record]:
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        for rec in records:
            if left is not None and left <= 0:
                return
            if only_id and rec.checkpoint_id != only_id:
                continue
            if before_id and rec.checkpoint_id >= before_id:
                continue
            if not _matches(rec.metadata, filter):
                continue
            if left is not None:
                left -= 1
            yield rec

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        w = self._w()
        prefix, only_id = self._prefix_for(config)
        page = limit if (limit and not filter and not only_id and not before) else 1000
        objs = (_Record(self, o.body or b"") for o in w.iter_objects(prefix, with_bodies=True, page=page))
        for rec in self._select(objs, only_id, filter, before, limit):
            yield rec.tuple(self._writes(w, rec))

    def _records(self, w: Worker, prefix: str) -> _List[_Record]:
        return [_Record(self, o.body or b"") for o in w.iter_objects(prefix, with_bodies=True)]

    def _drop(self, w: Worker, recs: Sequence[_Record]) -> None:
        for rec in recs:
            key = object_key(rec.thread_id, rec.ns, rec.checkpoint_id)
            w.delete_objects(key, idempotency_key=derived_key("lgd", key))
            stream = writes_stream(rec.thread_id, rec.ns, rec.checkpoint_id)
            w.delete_stream(stream, idempotency_key=derived_key("lgds", stream))

    def delete_thread(self, thread_id: str) -> None:
        w = self._w()
        op = uuid.uuid4().hex
        self._commit(w, self._maintenance("delete_thread", thread_id=thread_id), f"lg-maint-{op}", op)
        w.delete_objects(thread_prefix(thread_id), idempotency_key=derived_key("lgdt", op))
        w.delete_stream(f"lgw/{_q(thread_id)}", idempotency_key=derived_key("lgdts", op))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        w = self._w()
        op = uuid.uuid4().hex
        self._commit(w, self._maintenance("delete_for_runs", run_ids=sorted(wanted)), f"lg-maint-{op}", op)
        self._drop(w, [r for r in self._records(w, "lg/") if str(r.metadata.get("run_id")) in wanted])

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        w = self._w()
        recs = self._records(w, thread_prefix(source_thread_id))
        op = uuid.uuid4().hex
        self._commit(
            w,
            self._maintenance("copy_thread", source=source_thread_id, target=target_thread_id),
            f"lg-maint-{op}",
            op,
        )
        for rec in reversed(recs):  # oldest first
            body = rec.retarget(target_thread_id)
            key = object_key(target_thread_id, rec.ns, rec.checkpoint_id)
            w.put_object(key, body, idempotency_key=derived_key("lgo", key, sha256_digest(body)))
            entries = w.load_all(writes_stream(rec.thread_id, rec.ns, rec.checkpoint_id))
            if entries:
                stream = writes_stream(target_thread_id, rec.ns, rec.checkpoint_id)
                w.append(stream, [(e.id, e.body) for e in entries], idempotency_key=derived_key("lgw", stream, op))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        w = self._w()
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            recs = self._records(w, thread_prefix(thread_id))
            newest: dict[str, str] = {}
            for r in recs:
                if r.checkpoint_id > newest.get(r.ns, ""):
                    newest[r.ns] = r.checkpoint_id
            doomed = [r for r in recs if newest[r.ns] != r.checkpoint_id]
            if doomed:
                op = uuid.uuid4().hex
                self._commit(w, self._maintenance("prune", thread_id=thread_id), f"lg-maint-{op}", op)
                self._drop(w, doomed)

    # --- async API -----------------------------------------------------------------

    async def _async_revision(self, w: AsyncWorker) -> int:
        if self._revision is None:
            head = await w.load_head()
            self._head = head
            self._revision = head.revision if head else 0
            if head is not None:
                await self._arepair(w, head.state_id)
        return self._revision

    async def _arepair(self, w: AsyncWorker, state_id: str) -> None:
        body = await w.read_state(state_id)
        header, _ = _unframe(body)
        if header.get("kind") != "checkpoint":
            return
        key = object_key(header["thread_id"], header["checkpoint_ns"], header["checkpoint_id"])
        if await w.get_object(key) is None:
            await w.put_object(key, body, idempotency_key=derived_key("lgo", key, sha256_digest(body)))

    async def _acommit(
        self, w: AsyncWorker, body: bytes, run_id: str, ident: str, index: str | None = None
    ) -> None:
        async with self._alock_get():
            expected = await self._async_revision(w)
            head = await w.commit_inline(
                body,
                expected,
                run_id,
                index_key=index,
                idempotency_key=derived_key("lgp", ident, sha256_digest(body)),
            )
            self._revision = head.revision
            self._head = head

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        w = self._aw()
        thread_id, ns, cid, body = self._record(config, checkpoint, metadata)
        key = object_key(thread_id, ns, cid)
        await self._acommit(w, body, self._run_id(metadata, cid), key, index=key)
        return _config(thread_id, ns, cid)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        if not writes:
            return
        conf = config["configurable"]
        stream = writes_stream(str(conf["thread_id"]), str(conf.get("checkpoint_ns", "")), conf["checkpoint_id"])
        entries = self._write_entries(writes, task_id, task_path)
        await self._aw().append(
            stream, entries, idempotency_key=derived_key("lgw", stream, *(f"{e}={sha256_digest(b)}" for e, b in entries))
        )
        review = self._effect_review(writes)
        if review is not None:
            await self._acommit_interrupt(self._aw(), config, review)

    async def _awrites(self, w: AsyncWorker, rec: _Record) -> _List[tuple[str, str, Any]]:
        return self._decode_writes(await w.load_all(writes_stream(rec.thread_id, rec.ns, rec.checkpoint_id)))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        w = self._aw()
        conf = config["configurable"]
        thread_id = str(conf["thread_id"])
        ns = str(conf.get("checkpoint_ns", ""))
        if cid := get_checkpoint_id(config):
            obj = await w.get_object(object_key(thread_id, ns, cid))
            body = obj.body if obj else None
        else:
            page = await w.list_objects(ns_prefix(thread_id, ns), limit=1, with_bodies=True)
            body = page.objects[0].body if page.objects else None
        if body is None:
            return None
        rec = _Record(self, body)
        return rec.tuple(await self._awrites(w, rec))

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        w = self._aw()
        prefix, only_id = self._prefix_for(config)
        page = limit if (limit and not filter and not only_id and not before) else 1000
        before_id = get_checkpoint_id(before) if before else None
        left = limit
        async for o in w.iter_objects(prefix, with_bodies=True, page=page):
            if left is not None and left <= 0:
                return
            rec = _Record(self, o.body or b"")
            if only_id and rec.checkpoint_id != only_id:
                continue
            if before_id and rec.checkpoint_id >= before_id:
                continue
            if not _matches(rec.metadata, filter):
                continue
            if left is not None:
                left -= 1
            yield rec.tuple(await self._awrites(w, rec))

    async def _arecords(self, w: AsyncWorker, prefix: str) -> _List[_Record]:
        return [_Record(self, o.body or b"") async for o in w.iter_objects(prefix, with_bodies=True)]

    async def _adrop(self, w: AsyncWorker, recs: Sequence[_Record]) -> None:
        for rec in recs:
            key = object_key(rec.thread_id, rec.ns, rec.checkpoint_id)
            await w.delete_objects(key, idempotency_key=derived_key("lgd", key))
            stream = writes_stream(rec.thread_id, rec.ns, rec.checkpoint_id)
            await w.delete_stream(stream, idempotency_key=derived_key("lgds", stream))

    async def adelete_thread(self, thread_id: str) -> None:
        w = self._aw()
        op = uuid.uuid4().hex
        await self._acommit(w, self._maintenance("delete_thread", thread_id=thread_id), f"lg-maint-{op}", op)
        await w.delete_objects(thread_prefix(thread_id), idempotency_key=derived_key("lgdt", op))
        await w.delete_stream(f"lgw/{_q(thread_id)}", idempotency_key=derived_key("lgdts", op))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        wanted = {str(r) for r in run_ids}
        if not wanted:
            return
        w = self._aw()
        op = uuid.uuid4().hex
        await self._acommit(
            w, self._maintenance("delete_for_runs", run_ids=sorted(wanted)), f"lg-maint-{op}", op
        )
        recs = await self._arecords(w, "lg/")
        await self._adrop(w, [r for r in recs if str(r.metadata.get("run_id")) in wanted])

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        w = self._aw()
        recs = await self._arecords(w, thread_prefix(source_thread_id))
        op = uuid.uuid4().hex
        await self._acommit(
            w,
            self._maintenance("copy_thread", source=source_thread_id, target=target_thread_id),
            f"lg-maint-{op}",
            op,
        )
        for rec in reversed(recs):
            body = rec.retarget(target_thread_id)
            key = object_key(target_thread_id, rec.ns, rec.checkpoint_id)
            await w.put_object(key, body, idempotency_key=derived_key("lgo", key, sha256_digest(body)))
            entries = await w.load_all(writes_stream(rec.thread_id, rec.ns, rec.checkpoint_id))
            if entries:
                stream = writes_stream(target_thread_id, rec.ns, rec.checkpoint_id)
                await w.append(
                    stream, [(e.id, e.body) for e in entries], idempotency_key=derived_key("lgw", stream, op)
                )

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'")
        w = self._aw()
        for thread_id in thread_ids:
            if strategy == "delete":
                await self.adelete_thread(thread_id)
                continue
            recs = await self._arecords(w, thread_prefix(thread_id))
            newest: dict[str, str] = {}
            for r in recs:
                if r.checkpoint_id > newest.get(r.ns, ""):
                    newest[r.ns] = r.checkpoint_id
            doomed = [r for r in recs if newest[r.ns] != r.checkpoint_id]
            if doomed:
                op = uuid.uuid4().hex
                await self._acommit(w, self._maintenance("prune", thread_id=thread_id), f"lg-maint-{op}", op)
                await self._adrop(w, doomed)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """Monotonic string versions (as LangGraph's own savers use): a zero-padded
        counter, then a random tiebreak."""
        if current is None:
            n = 0
        elif isinstance(current, int):
            n = current
        else:
            n = int(str(current).split(".")[0])
        return f"{n + 1:032}.{random.random():016}"


__all__ = ["CODEC", "HarnessCheckpointSaver", "HarnessError"]
