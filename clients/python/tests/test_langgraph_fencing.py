"""Two writers on one LangGraph thread: the stale one is refused and the checkpoint
chain never forks. Also: sync graphs, special pending writes, and recovery of a
checkpoint whose commit landed but whose object write did not.

Serve mode has no operator, so nothing in it replaces a worker. Where a test needs a
replacement, it does the operator's step 2 (raise the binding's fence in the store,
DESIGN §3) with the one statement the store's `raise_fence` runs (`conftest.raise_fence`);
everything else goes through the HTTP API."""

from __future__ import annotations

import uuid
from collections import Counter

import pytest
from langgraph.checkpoint.base import WRITES_IDX_MAP
from langgraph.checkpoint.serde.types import ERROR, INTERRUPT

from harness_engine import AsyncHarnessClient, Fence, RevisionConflict, StaleLease
from harness_engine.langgraph import CODEC, HarnessCheckpointSaver
from harness_engine.langgraph.checkpoint import object_key
from conftest import raise_fence
from graphs import build


def _saver(client, binding, fence: Fence | None = None) -> HarnessCheckpointSaver:
    return HarnessCheckpointSaver(client.worker(binding.binding_id, fence=fence or binding.fence, codec=CODEC))


def _assert_linear(saver: HarnessCheckpointSaver, thread_id: str) -> list:
    tuples = list(saver.list({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}))
    parents = Counter(
        t.parent_config["configurable"]["checkpoint_id"] for t in tuples if t.parent_config
    )
    forks = {p: n for p, n in parents.items() if n > 1}
    assert not forks, f"the checkpoint chain forked at {forks}"
    roots = [t for t in tuples if t.parent_config is None]
    assert len(roots) == 1, "one chain, one root"
    return tuples


def test_two_writers_same_lease_second_is_refused_and_no_fork(client) -> None:
    binding = client.bind("agent-lg", f"conv-{uuid.uuid4().hex}", "deepagents")
    cfg = {"configurable": {"thread_id": "t"}}
    a, b = _saver(client, binding), _saver(client, binding)
    build(a).invoke({"steps": []}, cfg)
    # Both workers start from the same durable head (say, a retried delivery of the
    # same turn to two sandboxes).
    a.load_head()
    b.load_head()
    before = _assert_linear(a, "t")

    build(a).invoke({"steps": ["a"]}, cfg)
    with pytest.raises(RevisionConflict) as refused:
        build(b).invoke({"steps": ["b"]}, cfg)
    assert refused.value.actual == a.revision

    after = _assert_linear(a, "t")
    assert len(after) > len(before)
    state = build(a).get_state(cfg).values["steps"]
    assert "b" not in state and "a" in state, state


def test_replaced_worker_is_refused_and_the_new_one_continues(client, server) -> None:
    binding = client.bind("agent-lg", f"conv-{uuid.uuid4().hex}", "deepagents")
    cfg = {"configurable": {"thread_id": "t"}}
    old = _saver(client, binding)
    build(old).invoke({"steps": []}, cfg)
    first = _assert_linear(old, "t")

    raise_fence(server, binding.binding_id, binding.lease_generation + 1)
    new = _saver(client, binding, Fence(binding.epoch, binding.lease_generation + 1))
    head = new.load_head()
    assert head is not None and head.revision == old.revision

    with pytest.raises(StaleLease) as refused:
        build(old).invoke({"steps": ["late"]}, cfg)
    assert refused.value.details == {"presented": 1, "current": 2}

    out = build(new).invoke({"steps": ["next"]}, cfg)
    assert out["steps"][:3] == first[0].checkpoint["channel_values"]["steps"]
    assert "late" not in out["steps"]
    chain = _assert_linear(new, "t")
    assert len(chain) == 2 * len(first), "the new worker extended the old chain, nothing else did"


async def test_async_graph_and_special_writes(server) -> None:
    aclient = AsyncHarnessClient(server.api, token=server.token)
    try:
        binding = await aclient.bind("agent-lg", f"conv-{uuid.uuid4().hex}", "deepagents")
        saver = HarnessCheckpointSaver(async_worker=await aclient.worker(binding, codec=CODEC))
        cfg = {"configurable": {"thread_id": "t"}}
        out = await build(saver).ainvoke({"steps": []}, cfg)
        assert out["steps"] == ["plan:0", "act:1", "reflect:2"]

        latest = await saver.aget_tuple(cfg)
        assert latest is not None
        task = "task-1"
        await saver.aput_writes(latest.config, [("ch", "first")], task)
        await saver.aput_writes(latest.config, [("ch", "second")], task)  # regular: first wins
        await saver.aput_writes(latest.config, [(ERROR, "boom-1"), (INTERRUPT, {"q": 1})], task)
        await saver.aput_writes(latest.config, [(ERROR, "boom-2")], task)  # special: last wins
        tup = await saver.aget_tuple(latest.config)
        got = {(t, c): v for t, c, v in tup.pending_writes}
        assert got == {(task, "ch"): "first", (task, ERROR): "boom-2", (task, INTERRUPT): {"q": 1}}
        # Sorted like LangGraph replays them: (task_path, task_id, idx).
        idx = [WRITES_IDX_MAP.get(c, 0) for _, c, _ in tup.pending_writes]
        assert idx == sorted(idx)
    finally:
        await aclient.aclose()


def test_commit_without_object_is_repaired_by_the_next_worker(client) -> None:
    binding = client.bind("agent-lg", f"conv-{uuid.uuid4().hex}", "deepagents")
    cfg = {"configurable": {"thread_id": "t"}}
    saver = _saver(client, binding)
    build(saver).invoke({"steps": []}, cfg)
    latest = saver.get_tuple(cfg)
    key = object_key("t", "", latest.config["configurable"]["checkpoint_id"])
    # The worker died after its commit and before its object write: the head names a
    # checkpoint the index does not have.
    client.worker(binding).delete_objects(key)
    assert saver.get_tuple(cfg).config != latest.config

    fresh = _saver(client, binding)
    fresh.load_head()
    repaired = fresh.get_tuple(cfg)
    assert repaired.config == latest.config
    assert repaired.checkpoint["channel_values"] == latest.checkpoint["channel_values"]


async def test_connect_gives_one_writer_for_sync_and_async(server) -> None:
    from harness_engine import HarnessClient

    with HarnessClient(server.api, token=server.token) as c:
        binding = c.bind("agent-lg", f"conv-{uuid.uuid4().hex}", "deepagents")
    saver = HarnessCheckpointSaver.connect(binding.binding_id, server.api, token=server.token)
    cfg = {"configurable": {"thread_id": "t"}}
    build(saver).invoke({"steps": []}, cfg)
    after_sync = saver.revision
    out = await build(saver).ainvoke({"steps": ["more"]}, cfg)
    assert out["steps"][:3] == ["plan:0", "act:1", "reflect:2"]
    assert saver.revision > after_sync
    saver.close()
