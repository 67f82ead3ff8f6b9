"""Deep Agents on Harness Engine: a worker dies mid-conversation and a new one carries on.

The one-line change is the checkpointer: ``create_deep_agent(..., checkpointer=saver)``
with ``saver = HarnessCheckpointSaver(client.worker(binding_id))``.

What this runs (no network, no API key: the model is scripted):

1. a `harness-engine serve` on free ports (or the one named by HARNESS_ENGINE_ENDPOINT
   and HARNESS_ENGINE_TOKEN_FILE), and a binding for the conversation;
2. worker 1, a separate process configured only through the environment a sandbox gets
   (HARNESS_ENGINE_ENDPOINT, HARNESS_ENGINE_TOKEN_FILE), answers the first turn: the
   model writes /notes/launch.md with the agent's file tool;
3. worker 2 takes the second turn; the model asks for the `check_calendar` tool and the
   worker is killed (SIGKILL) inside that tool, after the model's answer was committed;
4. worker 3 starts from the durable head: it finds the turn half done, resumes it
   (`invoke(None)`), so the model's tool call is not asked for again, runs the tool,
   and finishes the turn, writing /notes/log.md.

    python examples/deepagents_restart.py          # prints what each worker did
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import tool

from harness_engine import HarnessClient
from harness_engine.langgraph import CODEC, HarnessCheckpointSaver

TURN_1 = "Write a note about the launch."
TURN_2 = "Check the launch date in the calendar, then log it."
CRASH_ENV = "EXAMPLE_CRASH_IN_TOOL"


class ScriptedModel(BaseChatModel):
    """Answers from the conversation so far, so every worker process, however many
    times it restarts, asks for the same next step."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Any, **kwargs: Any) -> ScriptedModel:  # type: ignore[override]
        return self

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        last_human = max(i for i, m in enumerate(messages) if isinstance(m, HumanMessage))
        prompt = messages[last_human].content
        results = [m for m in messages[last_human:] if isinstance(m, ToolMessage)]
        if prompt == TURN_1:
            if not results:
                reply = _call("write_file", file_path="/notes/launch.md", content="Launch: Tuesday 10:00\n")
            else:
                reply = AIMessage(content="Saved the launch note to /notes/launch.md.")
        elif prompt == TURN_2:
            if not results:
                reply = _call("check_calendar", event="launch")
            elif len(results) == 1:
                reply = _call("write_file", file_path="/notes/log.md", content=f"confirmed: {results[0].content}\n")
            else:
                reply = AIMessage(content="Logged the confirmed launch date to /notes/log.md.")
        else:
            reply = AIMessage(content="I only know this script.")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def _call(name: str, **args: Any) -> AIMessage:
    return AIMessage(content="", tool_calls=[{"name": name, "args": args, "id": f"call-{name}-{uuid.uuid4().hex[:8]}"}])


@tool
def check_calendar(event: str) -> str:
    """Look up an event in the team calendar."""
    if os.environ.get(CRASH_ENV) == "1":
        # The sandbox is lost in the middle of the turn: no cleanup, no goodbye.
        os.kill(os.getpid(), signal.SIGKILL)
    return f"{event} is on Tuesday at 10:00"


def make_agent(saver: HarnessCheckpointSaver) -> Any:
    from deepagents import create_deep_agent

    return create_deep_agent(
        model=ScriptedModel(),
        tools=[check_calendar],
        system_prompt="You keep the team's notes.",
        checkpointer=saver,
    )


def worker(binding_id: str, say: str | None) -> None:
    """One worker process: everything it knows comes from the durable head."""
    client = HarnessClient()  # HARNESS_ENGINE_ENDPOINT and HARNESS_ENGINE_TOKEN_FILE
    saver = HarnessCheckpointSaver(client.worker(binding_id, codec=CODEC))
    head = saver.load_head()
    agent = make_agent(saver)
    cfg = {"configurable": {"thread_id": "main"}, "recursion_limit": 50}
    snapshot = agent.get_state(cfg)
    report: dict[str, Any] = {
        "pid": os.getpid(),
        "head_revision": head.revision if head else 0,
        "resumed_half_done_turn": bool(snapshot.next),
    }
    if snapshot.next:
        agent.invoke(None, cfg, durability="sync")  # finish the turn the previous worker started
    if say is not None:
        # durability="sync": each step's checkpoint is committed before the next step
        # starts, so a worker lost mid-turn leaves a head to resume from.
        agent.invoke({"messages": [HumanMessage(content=say)]}, cfg, durability="sync")
    state = agent.get_state(cfg).values
    report["last_answer"] = state["messages"][-1].content
    report["files"] = sorted(state.get("files", {}))
    report["revision"] = saver.revision
    print(json.dumps(report), flush=True)


def _spawn(env: dict[str, str], binding_id: str, say: str | None, crash: bool = False) -> subprocess.CompletedProcess[str]:
    args = [sys.executable, __file__, "worker", "--binding", binding_id]
    if say is not None:
        args += ["--say", say]
    child_env = dict(env)
    if crash:
        child_env[CRASH_ENV] = "1"
    return subprocess.run(args, env=child_env, capture_output=True, text=True, timeout=300)


def _report(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    if done.returncode != 0:
        raise SystemExit(f"worker failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def run() -> dict[str, Any]:
    """The whole story; returns what the last worker saw (the test asserts on it)."""
    server = None
    endpoint = os.environ.get("HARNESS_ENGINE_ENDPOINT")
    token_file = os.environ.get("HARNESS_ENGINE_TOKEN_FILE")
    tmp = tempfile.mkdtemp(prefix="he-deepagents-")
    try:
        if not (endpoint and token_file):
            from harness_engine import testing

            server = testing.start()
            endpoint = server.api
            token_file = str(Path(tmp) / "token")
            Path(token_file).write_text(server.token)
        env = dict(os.environ, HARNESS_ENGINE_ENDPOINT=endpoint, HARNESS_ENGINE_TOKEN_FILE=token_file)
        control = HarnessClient(endpoint, token_file=token_file)
        binding = control.bind("notes-agent", f"conv-{uuid.uuid4().hex[:12]}", "deepagents")
        print(f"binding {binding.binding_id} (epoch {binding.epoch}, lease {binding.lease_generation})")

        first = _report(_spawn(env, binding.binding_id, TURN_1))
        print(f"worker 1 (pid {first['pid']}): {first['last_answer']!r}, head revision {first['revision']}")

        crashed = _spawn(env, binding.binding_id, TURN_2, crash=True)
        assert crashed.returncode == -signal.SIGKILL, (crashed.returncode, crashed.stderr)
        head = control.worker(binding).load_head()
        print(f"worker 2 was killed inside the tool call; durable head is at revision {head.revision if head else 0}")

        third = _report(_spawn(env, binding.binding_id, None))
        print(
            f"worker 3 (pid {third['pid']}) started from revision {third['head_revision']}, "
            f"resumed the half-done turn: {third['resumed_half_done_turn']}; "
            f"answer {third['last_answer']!r}; files {third['files']}"
        )
        third["crashed_head_revision"] = head.revision if head else 0
        third["first"] = first
        control.close()
        return third
    finally:
        if server is not None:
            server.stop()
        for p in Path(tmp).glob("*"):
            p.unlink()
        os.rmdir(tmp)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd")
    w = sub.add_parser("worker", help="run one worker process (used by the demo)")
    w.add_argument("--binding", required=True)
    w.add_argument("--say")
    args = parser.parse_args()
    if args.cmd == "worker":
        worker(args.binding, args.say)
    else:
        run()


if __name__ == "__main__":
    main()
