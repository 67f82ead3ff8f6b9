"""Shared fixtures: one live `harness-engine serve` per test session, and helpers that
bind a fresh conversation (so every test has its own binding and cannot see another's
state)."""

from __future__ import annotations

import json
import os
import sqlite3
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from harness_engine import testing as serve_mod  # noqa: E402

from harness_engine import AsyncHarnessClient, HarnessClient  # noqa: E402


@dataclass
class External:
    """A server someone else started (scripts/python-tests.sh): on SQLite in
    `data_dir`, or on MongoDB (FerretDB) when `mongodb_uri` is set."""

    api: str
    token: str
    data_dir: Path
    mongodb_uri: str | None = None
    mongodb_database: str | None = None

    @property
    def database(self) -> Path:
        return self.data_dir / "state.db"


def raise_fence(server: serve_mod.Serve | External, binding_id: str, generation: int) -> None:
    """The operator's step 2 (DESIGN §3) in serve mode, which has no operator: raise the
    binding's store fence to a new lease generation with the one statement the store's
    `raise_fence` runs, on whichever store the server uses."""
    uri = getattr(server, "mongodb_uri", None)
    if uri:
        import pymongo
        from bson.int64 import Int64

        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as mongo:
            sessions = mongo[server.mongodb_database]["harness_sessions"]
            done = sessions.update_one(
                {"_id": binding_id, "lease_generation": {"$lt": Int64(generation)}},
                {"$set": {"lease_generation": Int64(generation)}},
            )
            assert done.modified_count == 1, f"fence of {binding_id} not raised to {generation}"
        return
    with sqlite3.connect(server.database, timeout=10) as db:
        db.execute("PRAGMA busy_timeout = 10000")
        cur = db.execute(
            "UPDATE harness_sessions SET lease_generation = ? WHERE id = ? AND lease_generation < ?",
            (generation, binding_id, generation),
        )
        assert cur.rowcount == 1, f"fence of {binding_id} not raised to {generation}"


def degrade_ledger(server: serve_mod.Serve | External, binding_id: str, reducer: str = "ledger-reducer/0") -> None:
    """Labels the binding's stored ledger head as folded by another reducer, as a head
    written by a different release of the server would be (spec 003: degraded
    projections), on whichever store the server uses."""
    uri = getattr(server, "mongodb_uri", None)
    if uri:
        import pymongo

        with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as mongo:
            sessions = mongo[server.mongodb_database]["harness_sessions"]
            doc = sessions.find_one({"_id": binding_id}, {"ledger": 1})
            assert doc and "ledger" in doc, f"{binding_id} has no ledger head"
            state = json.loads(doc["ledger"]["state_json"])
            state["reducer"] = reducer
            done = sessions.update_one(
                {"_id": binding_id, "ledger.last_seq": doc["ledger"]["last_seq"]},
                {"$set": {"ledger.state_json": json.dumps(state)}},
            )
            assert done.modified_count == 1
        return
    with sqlite3.connect(server.database, timeout=10) as db:
        db.execute("PRAGMA busy_timeout = 10000")
        # The writer keeps decoded heads while the stored head's stamp is unchanged: move it.
        cur = db.execute(
            "UPDATE harness_ledger_heads SET state_json = json_set(state_json, '$.reducer', ?), "
            "updated_at_ms = updated_at_ms + 1 WHERE binding_id = ?",
            (reducer, binding_id),
        )
        assert cur.rowcount >= 1, f"{binding_id} has no ledger head"


@pytest.fixture(scope="session")
def server() -> Iterator[serve_mod.Serve | External]:
    endpoint = os.environ.get("HARNESS_ENGINE_TEST_ENDPOINT")
    if endpoint:
        token = Path(os.environ["HARNESS_ENGINE_TEST_TOKEN_FILE"]).read_text().strip()
        yield External(
            endpoint,
            token,
            Path(os.environ["HARNESS_ENGINE_TEST_DATA_DIR"]),
            os.environ.get("HARNESS_ENGINE_TEST_MONGODB_URI") or None,
            os.environ.get("HARNESS_ENGINE_TEST_MONGODB_DATABASE") or None,
        )
        return
    # The conformance suites write in bursts; the default per-binding rate limit
    # (500/s) would only make them slower (the client retries 429s), so raise it.
    s = serve_mod.start(extra_args=["--writes-per-second", "5000", "--write-burst", "10000"])
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def client(server: serve_mod.Serve) -> Iterator[HarnessClient]:
    c = HarnessClient(server.api, token=server.token)
    yield c
    c.close()


@pytest.fixture
def new_conversation() -> str:
    return f"conv-{uuid.uuid4().hex}"


def make_async_client(server: serve_mod.Serve) -> AsyncHarnessClient:
    return AsyncHarnessClient(server.api, token=server.token)
