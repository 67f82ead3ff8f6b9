"""LangGraph's own published conformance suite (`langgraph-checkpoint-conformance`)
against `HarnessCheckpointSaver` on a live server: every capability, base and extended."""

from __future__ import annotations

import uuid

from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import ProgressCallbacks

from harness_engine import AsyncHarnessClient, HarnessClient
from harness_engine.langgraph import CODEC, HarnessCheckpointSaver


async def test_langgraph_checkpoint_conformance(server) -> None:
    sync_client = HarnessClient(server.api, token=server.token)
    async_client = AsyncHarnessClient(server.api, token=server.token)

    @checkpointer_test(name="HarnessCheckpointSaver")
    async def harness_saver():
        # A fresh binding (conversation) per capability suite.
        binding = await async_client.bind("agent-lg", f"conv-{uuid.uuid4().hex}", "deepagents")
        aworker = await async_client.worker(binding, codec=CODEC)
        worker = sync_client.worker(binding, codec=CODEC)
        yield HarnessCheckpointSaver(worker, async_worker=aworker)

    try:
        report = await validate(harness_saver, progress=ProgressCallbacks.verbose())
    finally:
        await async_client.aclose()
        sync_client.close()
    report.print_report()
    failures = {
        cap: result.failures for cap, result in report.results.items() if result.passed is False
    }
    assert not failures, failures
    # Every capability, including the extended ones, was detected and passed.
    assert all(r.passed for r in report.results.values()), report.results
