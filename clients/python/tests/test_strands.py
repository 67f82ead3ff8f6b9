"""`HarnessSessionRepository` under the real Strands agent loop (scripted model, no
network) against a live server: the session survives a new worker, a taken message
index is refused without any caller-side lock, and a replaced worker is fenced out."""

from __future__ import annotations

import threading
import uuid

import pytest
from strands import Agent, tool
from strands.types.exceptions import SessionException
from strands.types.session import Session, SessionAgent, SessionMessage, SessionType

from harness_engine import Fence, StaleLease
from harness_engine.strands import HarnessSessionManager, HarnessSessionRepository
from scripted_strands import ScriptedModel


@tool
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


def _binding(client):
    return client.bind("agent-strands", f"conv-{uuid.uuid4().hex}", "strands")


def test_agent_loop_persists_and_a_new_worker_resumes(client) -> None:
    binding = _binding(client)
    model = ScriptedModel(
        [
            {"tool": "add", "id": "t1", "input": {"a": 2, "b": 3}},
            {"text": "2 + 3 = 5"},
        ]
    )
    agent = Agent(
        model=model,
        tools=[add],
        agent_id="calc",
        session_manager=HarnessSessionManager("s-1", client.worker(binding)),
        callback_handler=None,
    )
    result = agent("what is 2 + 3?")
    assert "5" in str(result)

    repo = HarnessSessionRepository(client.worker(binding))
    stored = repo.list_messages("s-1", "calc")
    # user prompt, tool call, tool result, final answer: the loop's whole turn.
    assert [m.message["role"] for m in stored] == ["user", "assistant", "user", "assistant"]
    assert stored[2].message["content"][0]["toolResult"]["content"][0]["text"] == "5"
    assert [m.message_id for m in stored] == [0, 1, 2, 3]

    # A new worker (a new process in production) on the same binding: a fresh Agent
    # restores the conversation from the store and the model sees it all.
    model2 = ScriptedModel([{"text": "you asked about 2 + 3"}])
    agent2 = Agent(
        model=model2,
        tools=[add],
        agent_id="calc",
        session_manager=HarnessSessionManager("s-1", client.worker(binding)),
        callback_handler=None,
    )
    assert len(agent2.messages) == 4
    agent2("what did I ask?")
    assert len(model2.seen[0]) == 5, "the restored history plus the new prompt reached the model"
    assert [m.message_id for m in repo.list_messages("s-1", "calc")] == [0, 1, 2, 3, 4, 5]
    assert [m.message_id for m in repo.list_messages("s-1", "calc", limit=2, offset=1)] == [1, 2]
    journal = repo.journal("s-1")
    assert [(j["op"], j["message_id"]) for j in journal] == [("created", i) for i in range(6)]


def test_message_index_is_created_once_without_a_lock(client) -> None:
    binding = _binding(client)
    repo = HarnessSessionRepository(client.worker(binding))
    repo.create_session(Session(session_id="s", session_type=SessionType.AGENT))
    repo.create_agent("s", SessionAgent(agent_id="a", state={}, conversation_manager_state={}))
    with pytest.raises(SessionException):
        repo.create_session(Session(session_id="s", session_type=SessionType.AGENT))

    # Eight threads race to write message 0, each with its own text.
    outcomes: list[str] = []
    lock = threading.Lock()

    def racer(i: int) -> None:
        worker_repo = HarnessSessionRepository(client.worker(binding))
        msg = SessionMessage(message={"role": "user", "content": [{"text": f"from {i}"}]}, message_id=0)
        try:
            worker_repo.create_message("s", "a", msg)
            with lock:
                outcomes.append(f"won {i}")
        except SessionException:
            with lock:
                outcomes.append("refused")

    threads = [threading.Thread(target=racer, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    winners = [o for o in outcomes if o.startswith("won")]
    assert len(winners) == 1, outcomes
    stored = repo.read_message("s", "a", 0)
    assert stored is not None
    assert stored.message["content"][0]["text"] == "from " + winners[0].split()[1]

    # Redaction goes through If-Match on the version it read.
    stored.redact_message = {"role": "user", "content": [{"text": "[redacted]"}]}
    repo.update_message("s", "a", stored)
    again = repo.read_message("s", "a", 0)
    assert again is not None and again.redact_message == stored.redact_message
    assert again.created_at == stored.created_at


def test_replaced_worker_cannot_write(client) -> None:
    binding = _binding(client)
    stale = HarnessSessionRepository(
        client.worker(binding.binding_id, fence=Fence(binding.epoch, binding.lease_generation - 1))
    )
    with pytest.raises(StaleLease):
        stale.create_session(Session(session_id="s", session_type=SessionType.AGENT))
    assert HarnessSessionRepository(client.worker(binding)).read_session("s") is None
