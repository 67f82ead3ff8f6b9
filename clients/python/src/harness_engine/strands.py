"""Strands Agents `SessionRepository` on Harness Engine native objects and streams.

Layout inside one binding:

- ``st/<session>/session``: the `Session` record, created with `If-None-Match: *`
  (a second `create_session` is refused, like Strands' file repository does).
- ``st/<session>/a/<agent>/agent``: the `SessionAgent` record; updates replace the
  version they read (`If-Match`), so a concurrent update is detected, not lost.
- ``st/<session>/a/<agent>/m/<message_id, 12 digits>``: one object per message. The
  create is conditional on the message index (`If-None-Match: *`): two workers that
  both believe they are appending message N cannot both succeed, and neither needs a
  lock on the caller's side. A retry of the same create (same body) is recognised and
  succeeds; a different message at a taken index raises `SessionException`.
- ``st/<session>/ma/<multi_agent>``: multi-agent state.
- ``st/<session>/journal``: an append-only stream recording each message created or
  redacted (`{op, agent_id, message_id}`, entry id ``<op>:<agent>:<message_id>``), so a
  control plane can follow a session's progress without reading message bodies.

Every call carries the worker's fence, so a replaced worker's writes are refused with
`StaleLease` by the server, atomically with the write.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from strands.session.repository_session_manager import RepositorySessionManager
from strands.session.session_repository import SessionRepository
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage

from ._core import derived_key, sha256_digest
from .client import Worker
from .errors import Conflict

if TYPE_CHECKING:
    from strands.multiagent.base import MultiAgentBase

_UPDATE_ATTEMPTS = 8


def _q(part: str) -> str:
    return quote(part, safe="")


def _dump(d: dict[str, Any]) -> bytes:
    return json.dumps(d, separators=(",", ":"), sort_keys=True).encode()


class HarnessSessionRepository(SessionRepository):
    """A Strands `SessionRepository` whose sessions live in one Harness Engine binding."""

    def __init__(self, worker: Worker, *, journal: bool = True) -> None:
        self.worker = worker
        self._journal = journal

    # keys
    @staticmethod
    def _session_key(session_id: str) -> str:
        return f"st/{_q(session_id)}/session"

    @staticmethod
    def _agent_key(session_id: str, agent_id: str) -> str:
        return f"st/{_q(session_id)}/a/{_q(agent_id)}/agent"

    @staticmethod
    def _messages_prefix(session_id: str, agent_id: str) -> str:
        return f"st/{_q(session_id)}/a/{_q(agent_id)}/m/"

    @classmethod
    def _message_key(cls, session_id: str, agent_id: str, message_id: int) -> str:
        if message_id < 0:
            raise SessionException(f"message id must be >= 0, got {message_id}")
        return f"{cls._messages_prefix(session_id, agent_id)}{message_id:012d}"

    @staticmethod
    def _multi_agent_key(session_id: str, multi_agent_id: str) -> str:
        return f"st/{_q(session_id)}/ma/{_q(multi_agent_id)}"

    def _create(self, key: str, body: bytes, what: str) -> None:
        try:
            self.worker.put_object(
                key, body, if_none_match=True, idempotency_key=derived_key("stc", key, sha256_digest(body))
            )
        except Conflict as err:
            existing = self.worker.get_object(key)
            if existing is not None and existing.body == body:
                return  # the same create, retried
            raise SessionException(f"{what} already exists") from err

    def _read(self, key: str) -> tuple[dict[str, Any], int] | None:
        obj = self.worker.get_object(key)
        if obj is None or obj.body is None:
            return None
        return json.loads(obj.body), obj.version

    def _note(self, session_id: str, op: str, agent_id: str, message_id: int, version: int = 0) -> None:
        if not self._journal:
            return
        entry_id = f"{op}:{agent_id}:{message_id}:{version}"
        body = _dump({"op": op, "agent_id": agent_id, "message_id": message_id})
        stream = f"st/{_q(session_id)}/journal"
        self.worker.append(stream, [(entry_id, body)], idempotency_key=derived_key("stj", stream, entry_id))

    # sessions
    def create_session(self, session: Session, **kwargs: Any) -> Session:
        self._create(
            self._session_key(session.session_id), _dump(session.to_dict()), f"Session {session.session_id}"
        )
        return session

    def read_session(self, session_id: str, **kwargs: Any) -> Session | None:
        got = self._read(self._session_key(session_id))
        return Session.from_dict(got[0]) if got else None

    def delete_session(self, session_id: str, **kwargs: Any) -> None:
        prefix = f"st/{_q(session_id)}/"
        if self.worker.get_object(self._session_key(session_id)) is None:
            raise SessionException(f"Session {session_id} does not exist")
        self.worker.delete_objects(prefix, idempotency_key=derived_key("std", prefix))
        self.worker.delete_stream(f"st/{_q(session_id)}/journal", idempotency_key=derived_key("stdj", prefix))

    # agents
    def create_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        self._create(
            self._agent_key(session_id, session_agent.agent_id),
            _dump(session_agent.to_dict()),
            f"Agent {session_agent.agent_id} in session {session_id}",
        )

    def read_agent(self, session_id: str, agent_id: str, **kwargs: Any) -> SessionAgent | None:
        got = self._read(self._agent_key(session_id, agent_id))
        return SessionAgent.from_dict(got[0]) if got else None

    def update_agent(self, session_id: str, session_agent: SessionAgent, **kwargs: Any) -> None:
        key = self._agent_key(session_id, session_agent.agent_id)
        for _ in range(_UPDATE_ATTEMPTS):
            got = self._read(key)
            if got is None:
                raise SessionException(
                    f"Agent {session_agent.agent_id} in session {session_id} does not exist"
                )
            previous, version = got
            session_agent.created_at = previous.get("created_at", session_agent.created_at)
            try:
                self.worker.put_object(key, _dump(session_agent.to_dict()), if_match=version)
                return
            except Conflict:
                continue
        raise SessionException(f"Agent {session_agent.agent_id} kept changing under the update")

    # messages
    def create_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        message_id = session_message.message_id
        self._create(
            self._message_key(session_id, agent_id, message_id),
            _dump(session_message.to_dict()),
            f"Message {message_id} of agent {agent_id} in session {session_id}",
        )
        self._note(session_id, "created", agent_id, message_id)

    def read_message(
        self, session_id: str, agent_id: str, message_id: int, **kwargs: Any
    ) -> SessionMessage | None:
        got = self._read(self._message_key(session_id, agent_id, message_id))
        return SessionMessage.from_dict(got[0]) if got else None

    def update_message(
        self, session_id: str, agent_id: str, session_message: SessionMessage, **kwargs: Any
    ) -> None:
        message_id = session_message.message_id
        key = self._message_key(session_id, agent_id, message_id)
        for _ in range(_UPDATE_ATTEMPTS):
            got = self._read(key)
            if got is None:
                raise SessionException(f"Message {message_id} does not exist")
            previous, version = got
            session_message.created_at = previous.get("created_at", session_message.created_at)
            try:
                stored = self.worker.put_object(key, _dump(session_message.to_dict()), if_match=version)
                self._note(session_id, "updated", agent_id, message_id, stored.version)
                return
            except Conflict:
                continue
        raise SessionException(f"Message {message_id} kept changing under the update")

    def list_messages(
        self,
        session_id: str,
        agent_id: str,
        limit: int | None = None,
        offset: int = 0,
        **kwargs: Any,
    ) -> list[SessionMessage]:
        if self.worker.get_object(self._agent_key(session_id, agent_id)) is None:
            raise SessionException(f"Agent {agent_id} in session {session_id} does not exist")
        objs = list(self.worker.iter_objects(self._messages_prefix(session_id, agent_id), with_bodies=True))
        objs.reverse()  # the server lists newest key first; messages go oldest first
        window = objs[offset : offset + limit] if limit is not None else objs[offset:]
        return [SessionMessage.from_dict(json.loads(o.body or b"{}")) for o in window]

    # multi-agent
    def create_multi_agent(self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any) -> None:
        self._create(
            self._multi_agent_key(session_id, multi_agent.id),
            _dump(multi_agent.serialize_state()),
            f"MultiAgent {multi_agent.id} in session {session_id}",
        )

    def read_multi_agent(self, session_id: str, multi_agent_id: str, **kwargs: Any) -> dict[str, Any] | None:
        got = self._read(self._multi_agent_key(session_id, multi_agent_id))
        return got[0] if got else None

    def update_multi_agent(self, session_id: str, multi_agent: MultiAgentBase, **kwargs: Any) -> None:
        key = self._multi_agent_key(session_id, multi_agent.id)
        got = self._read(key)
        if got is None:
            raise SessionException(f"MultiAgent state {multi_agent.id} in session {session_id} does not exist")
        self.worker.put_object(key, _dump(multi_agent.serialize_state()), if_match=got[1])

    def journal(self, session_id: str) -> list[dict[str, Any]]:
        """The session's change journal, oldest first."""
        return [json.loads(e.body) for e in self.worker.load_all(f"st/{_q(session_id)}/journal")]


class HarnessSessionManager(RepositorySessionManager):
    """The one-line change for a Strands agent:
    ``Agent(session_manager=HarnessSessionManager(session_id, worker))``."""

    def __init__(self, session_id: str, worker: Worker, **kwargs: Any) -> None:
        super().__init__(session_id=session_id, session_repository=HarnessSessionRepository(worker), **kwargs)


__all__ = ["HarnessSessionManager", "HarnessSessionRepository"]
