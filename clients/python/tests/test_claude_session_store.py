"""The Claude Agent SDK's own `run_session_store_conformance` against
`HarnessSessionStore` on a live server, plus what the suite does not cover: fencing,
retries that must not duplicate, and concurrent folding."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from claude_agent_sdk.testing import run_session_store_conformance

from harness_engine import AsyncHarnessClient, Fence, StaleLease
from harness_engine.claude import HarnessSessionStore


@pytest.fixture
async def aclient(server):
    c = AsyncHarnessClient(server.api, token=server.token)
    yield c
    await c.aclose()


async def _store(aclient: AsyncHarnessClient) -> HarnessSessionStore:
    binding = await aclient.bind("agent-claude", f"conv-{uuid.uuid4().hex}", "claude_agent_sdk")
    return HarnessSessionStore(await aclient.worker(binding))


async def test_sdk_session_store_conformance(aclient) -> None:
    # Every optional method is implemented, so all 14 contracts run; a fresh binding
    # per contract gives the isolation the suite asks of `make_store`.
    await run_session_store_conformance(lambda: _store(aclient))


async def test_optional_methods_are_detected(aclient) -> None:
    from claude_agent_sdk.testing.session_store_conformance import _has_optional

    store = await _store(aclient)
    for method in ("list_sessions", "list_session_summaries", "delete", "list_subkeys"):
        assert _has_optional(store, method, frozenset()), method


async def test_append_dedups_by_uuid_and_keeps_uuidless_entries(aclient) -> None:
    store = await _store(aclient)
    key = {"project_key": "p", "session_id": "s"}
    await store.append(key, [{"type": "user", "uuid": "u1", "n": 1}, {"type": "tag", "tag": "x"}])
    # The SDK re-sends a batch after a failure it could not classify: same uuids.
    await store.append(key, [{"type": "user", "uuid": "u1", "n": 1}, {"type": "tag", "tag": "x"}])
    loaded = await store.load(key)
    assert loaded == [
        {"type": "user", "uuid": "u1", "n": 1},
        {"type": "tag", "tag": "x"},
        {"type": "tag", "tag": "x"},
    ]


async def test_concurrent_appends_fold_every_entry_once(aclient) -> None:
    store = await _store(aclient)
    key = {"project_key": "p", "session_id": "busy"}
    batches = [
        [{"type": "user", "uuid": f"{i}-{j}", "timestamp": f"2024-01-01T00:00:{i:02d}.000Z"} for j in range(3)]
        for i in range(8)
    ]
    await asyncio.gather(*(store.append(key, b) for b in batches))
    [summary] = await store.list_session_summaries("p")
    # Folding from scratch over the whole transcript gives the same summary: no batch
    # was lost or folded twice by the racing appends.
    from claude_agent_sdk import fold_session_summary

    expected = fold_session_summary(None, key, await store.load(key))
    assert summary["data"] == expected["data"]


async def test_replaced_worker_is_refused(aclient, server) -> None:
    binding = await aclient.bind("agent-claude", f"conv-{uuid.uuid4().hex}", "claude_agent_sdk")
    stale = HarnessSessionStore(
        await aclient.worker(binding.binding_id, fence=Fence(binding.epoch, binding.lease_generation - 1))
    )
    with pytest.raises(StaleLease):
        await stale.append({"project_key": "p", "session_id": "s"}, [{"type": "x", "uuid": "a"}])
    fresh = HarnessSessionStore(await aclient.worker(binding))
    assert await fresh.load({"project_key": "p", "session_id": "s"}) is None
