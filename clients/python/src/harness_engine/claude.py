"""Claude Agent SDK `SessionStore` on Harness Engine native streams.

Layout inside one binding:

- transcript of a session: the stream ``cl/<project>/<session>``; a subagent
  transcript (a key with ``subpath``) is the sub-stream ``cl/<project>/<session>/<subpath>``,
  so deleting the main transcript cascades to its subpaths on the server, in one call.
- entry ids: ``u:<uuid>`` for entries that carry a ``uuid`` (the server skips an id the
  stream already holds, which is the SDK's de-duplication rule), a fresh random id for
  those that do not (titles, tags: appended without de-duplication). A retried append
  resends the same ids, so a retry never duplicates.
- summary of a session: the object ``cls/<project>/<session>/summary`` holding the
  output of the SDK's own `fold_session_summary` and the stream sequence number it has
  folded up to. Folding is serialized by compare-and-set on the object version
  (`If-Match`, or `If-None-Match: *` for the first), re-reading on conflict, so two
  concurrent appends never lose a fold; and because it folds "every entry after
  `folded_seq`" it never folds an entry twice and catches up after a crash.
  Its ``mtime`` is the object's server-side write time, written after the append, so
  it shares a clock with `list_sessions` and is never older than the transcript.
"""

from __future__ import annotations

import json
import uuid
from urllib.parse import quote, unquote

from claude_agent_sdk import fold_session_summary
from claude_agent_sdk.types import (
    SessionKey,
    SessionListSubkeysKey,
    SessionStore,
    SessionStoreEntry,
    SessionStoreListEntry,
    SessionSummaryEntry,
)

from ._core import derived_key, sha256_digest
from .client import AsyncWorker
from .errors import Conflict

# Folding retries before giving up on a contended summary (each retry re-reads).
_FOLD_ATTEMPTS = 16


def _q(part: str) -> str:
    return quote(part, safe="")


def _session_stream(project_key: str, session_id: str) -> str:
    return f"cl/{_q(project_key)}/{_q(session_id)}"


def _stream(key: SessionKey | SessionListSubkeysKey) -> str:
    base = _session_stream(key["project_key"], key["session_id"])
    subpath = key.get("subpath")
    if isinstance(subpath, str) and subpath:
        return f"{base}/{quote(subpath, safe='/')}"
    return base


def _summary_prefix(project_key: str, session_id: str) -> str:
    return f"cls/{_q(project_key)}/{_q(session_id)}/"


def _summary_key(project_key: str, session_id: str) -> str:
    return _summary_prefix(project_key, session_id) + "summary"


class HarnessSessionStore(SessionStore):
    """A `SessionStore` whose transcripts live in one Harness Engine binding.

    ``store = HarnessSessionStore(await client.worker(binding_id))`` and pass it as the
    SDK's ``session_store``. Every call carries the worker's fence: once the worker is
    replaced its writes are refused (`StaleLease`).
    """

    def __init__(self, worker: AsyncWorker, *, summaries: bool = True) -> None:
        self.worker = worker
        self._summaries = summaries

    async def append(self, key: SessionKey, entries: list[SessionStoreEntry]) -> None:
        if not entries:
            return
        stream = _stream(key)
        batch: list[tuple[str, bytes]] = []
        for entry in entries:
            uid = entry.get("uuid") if isinstance(entry, dict) else None
            entry_id = f"u:{uid}" if isinstance(uid, str) and uid else f"n:{uuid.uuid4().hex}"
            batch.append((entry_id, json.dumps(entry, separators=(",", ":")).encode()))
        await self.worker.append(
            stream, batch, idempotency_key=derived_key("cla", stream, *(f"{i}={sha256_digest(b)}" for i, b in batch))
        )
        if self._summaries and not key.get("subpath"):
            await self._fold(key)

    async def _fold(self, key: SessionKey) -> None:
        skey = _summary_key(key["project_key"], key["session_id"])
        stream = _stream(key)
        for _ in range(_FOLD_ATTEMPTS):
            current = await self.worker.get_object(skey)
            prev: SessionSummaryEntry | None = None
            folded = 0
            if current is not None and current.body is not None:
                stored = json.loads(current.body)
                folded = int(stored["folded_seq"])
                prev = {
                    "session_id": stored["session_id"],
                    "mtime": int(stored.get("mtime", 0)),
                    "data": stored["data"],
                }
            fresh = await self.worker.load_all(stream, after=folded)
            if not fresh:
                return
            summary = fold_session_summary(prev, key, [json.loads(e.body) for e in fresh])
            body = json.dumps(
                {
                    "session_id": summary["session_id"],
                    "data": summary["data"],
                    "folded_seq": fresh[-1].seq,
                },
                separators=(",", ":"),
            ).encode()
            try:
                if current is None:
                    await self.worker.put_object(skey, body, if_none_match=True)
                else:
                    await self.worker.put_object(skey, body, if_match=current.version)
                return
            except Conflict:
                continue  # another append folded first: read its result and fold the rest
        raise Conflict(
            f"the summary of session {key['session_id']!r} stayed contended for "
            f"{_FOLD_ATTEMPTS} attempts",
            code="conflict",
        )

    async def load(self, key: SessionKey) -> list[SessionStoreEntry] | None:
        entries = await self.worker.load_all(_stream(key))
        if not entries:
            return None
        return [json.loads(e.body) for e in entries]

    async def list_sessions(self, project_key: str) -> list[SessionStoreListEntry]:
        prefix = f"cl/{_q(project_key)}/"
        out: list[SessionStoreListEntry] = []
        for s in await self.worker.list_streams(prefix):
            rest = s.name[len(prefix) :]
            if "/" in rest or s.entries == 0:
                continue  # a subagent transcript, or an emptied stream
            out.append({"session_id": unquote(rest), "mtime": s.updated_at_ms})
        return out

    async def list_session_summaries(self, project_key: str) -> list[SessionSummaryEntry]:
        out: list[SessionSummaryEntry] = []
        async for obj in self.worker.iter_objects(f"cls/{_q(project_key)}/", with_bodies=True):
            if obj.body is None or not obj.key.endswith("/summary"):
                continue
            stored = json.loads(obj.body)
            out.append(
                {"session_id": stored["session_id"], "mtime": obj.updated_at_ms, "data": stored["data"]}
            )
        return out

    async def delete(self, key: SessionKey) -> None:
        stream = _stream(key)
        await self.worker.delete_stream(stream, idempotency_key=derived_key("cld", stream, uuid.uuid4().hex))
        if not key.get("subpath"):
            prefix = _summary_prefix(key["project_key"], key["session_id"])
            await self.worker.delete_objects(
                prefix, idempotency_key=derived_key("clds", prefix, uuid.uuid4().hex)
            )

    async def list_subkeys(self, key: SessionListSubkeysKey) -> list[str]:
        prefix = _session_stream(key["project_key"], key["session_id"]) + "/"
        return [
            unquote(s.name[len(prefix) :])
            for s in await self.worker.list_streams(prefix)
            if s.entries > 0
        ]


__all__ = ["HarnessSessionStore"]
