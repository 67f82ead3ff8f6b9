"""An example Harness Engine worker: a LangGraph agent with a scripted model (no LLM, no
network but the data plane) that keeps every checkpoint in Harness Engine.

It runs in a sandbox pod the way docs/python.md describes: `HarnessClient()` reads the
data-plane address from HARNESS_ENGINE_ENDPOINT and the projected ServiceAccount token
(audience harness-engine) from HARNESS_ENGINE_TOKEN_FILE, re-reading the file when the
kubelet rotates it. The only change from an in-memory LangGraph app is the checkpointer.

The chat backend hands turns to the sandbox over HTTP (port WORKER_PORT, default 8000):

    GET  /healthz                    200 "ok" (readiness)
    POST /turns {"binding_id": "hb_...", "message": "...", "thread_id": "main"}
         200 {"reply", "turns", "checkpoint_id", "pod"}: the turn ran and its
             checkpoints are committed (durability "sync": committed before the reply)
         409 {"code": "stale_lease", ...}: this worker was replaced; its write was
             refused by the fence and it must stop serving the binding
         4xx/5xx {"code", "message"}: any other refusal, in the data plane's shape

A worker reads the binding's fence once, on its first turn for that binding, and never
refreshes it: a replacement pod is a new process with the new fence, so the old pod's
late writes are refused (docs/operator.md, "Leases").
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.graph import START, MessagesState, StateGraph

from harness_engine import HarnessClient, HarnessError, StaleLease
from harness_engine.langgraph import HarnessCheckpointSaver


class ScriptedModel(BaseChatModel):
    """Answers from the conversation so far: turn N echoes the N-th message. Every
    worker, however often it is replaced, gives the same answer for the same history, so
    a test can tell a resumed conversation from a restarted one by the turn number."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        turns = sum(1 for m in messages if isinstance(m, HumanMessage))
        reply = AIMessage(content=f"turn {turns}: {messages[-1].content}")
        return ChatResult(generations=[ChatGeneration(message=reply)])


MODEL = ScriptedModel()


def respond(state: MessagesState) -> dict[str, list[BaseMessage]]:
    return {"messages": [MODEL.invoke(state["messages"])]}


BUILDER = StateGraph(MessagesState)
BUILDER.add_node("respond", respond)
BUILDER.add_edge(START, "respond")


class Worker:
    """One HarnessClient per process; one fenced worker and compiled graph per binding."""

    def __init__(self) -> None:
        self.client = HarnessClient()  # HARNESS_ENGINE_ENDPOINT, HARNESS_ENGINE_TOKEN_FILE
        self.graphs: dict[str, Any] = {}
        self.lock = threading.Lock()

    def graph(self, binding_id: str) -> Any:
        with self.lock:
            if binding_id not in self.graphs:
                saver = HarnessCheckpointSaver(self.client.worker(binding_id))
                self.graphs[binding_id] = BUILDER.compile(checkpointer=saver)
            return self.graphs[binding_id]

    def turn(self, binding_id: str, thread_id: str, message: str) -> dict[str, Any]:
        graph = self.graph(binding_id)
        config = {"configurable": {"thread_id": thread_id}}
        out = graph.invoke({"messages": [HumanMessage(content=message)]}, config, durability="sync")
        snapshot = graph.get_state(config)
        return {
            "reply": out["messages"][-1].content,
            "turns": sum(1 for m in out["messages"] if isinstance(m, HumanMessage)),
            "checkpoint_id": snapshot.config["configurable"]["checkpoint_id"],
            "pod": socket.gethostname(),
        }


def error_body(err: HarnessError) -> tuple[int, dict[str, Any]]:
    status = getattr(err, "status", None) or 500
    code = getattr(err, "code", None) or type(err).__name__
    if isinstance(err, StaleLease):
        status, code = 409, "stale_lease"
    return int(status), {"code": code, "message": str(err)}


def make_handler(worker: Worker) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def send_json(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:  # noqa: N802
            if self.path == "/healthz":
                self.send_json(200, "ok")
            else:
                self.send_json(404, {"code": "not_found", "message": self.path})

        def do_POST(self) -> None:  # noqa: N802
            if self.path != "/turns":
                self.send_json(404, {"code": "not_found", "message": self.path})
                return
            try:
                length = int(self.headers.get("Content-Length", "0"))
                req = json.loads(self.rfile.read(length) or b"{}")
                binding_id, message = req["binding_id"], req["message"]
                thread_id = req.get("thread_id", "main")
            except (ValueError, KeyError, TypeError) as err:
                self.send_json(400, {"code": "invalid", "message": f"bad turn request: {err}"})
                return
            try:
                self.send_json(200, worker.turn(binding_id, thread_id, message))
            except HarnessError as err:
                status, body = error_body(err)
                self.send_json(status, body)

        def log_message(self, fmt: str, *args: Any) -> None:
            sys.stdout.write("worker: " + (fmt % args) + "\n")
            sys.stdout.flush()

    return Handler


def main() -> None:
    port = int(os.environ.get("WORKER_PORT", "8000"))
    server = ThreadingHTTPServer(("0.0.0.0", port), make_handler(Worker()))
    # SIGTERM (pod deletion) stops serving at once; committed turns are already durable.
    signal.signal(signal.SIGTERM, lambda *_: threading.Thread(target=server.shutdown).start())
    print(f"worker: serving turns on :{port} for {os.environ.get('HARNESS_ENGINE_ENDPOINT')}", flush=True)
    server.serve_forever()
    print("worker: stopped", flush=True)


if __name__ == "__main__":
    main()
