"""The Deep Agents example (examples/deepagents_restart.py) end to end against the live
server: three worker processes, the second killed with SIGKILL inside a tool call; the
third starts from the durable head and finishes the interrupted turn."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

import deepagents_restart  # noqa: E402


def test_worker_restart_mid_conversation(server, tmp_path, monkeypatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(server.token)
    monkeypatch.setenv("HARNESS_ENGINE_ENDPOINT", server.api)
    monkeypatch.setenv("HARNESS_ENGINE_TOKEN_FILE", str(token_file))

    last = deepagents_restart.run()

    assert last["first"]["last_answer"] == "Saved the launch note to /notes/launch.md."
    # Worker 3 began exactly where the killed worker's last commit left the head...
    assert last["head_revision"] == last["crashed_head_revision"]
    assert last["crashed_head_revision"] > last["first"]["revision"], "worker 2 committed before dying"
    # ...found the second turn half done, and finished it.
    assert last["resumed_half_done_turn"] is True
    assert last["last_answer"] == "Logged the confirmed launch date to /notes/log.md."
    assert last["files"] == ["/notes/launch.md", "/notes/log.md"]
    assert last["revision"] > last["head_revision"]
