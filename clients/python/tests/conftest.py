"""Shared fixtures: one live `harness-engine serve` per test session, and helpers that
bind a fresh conversation (so every test has its own binding and cannot see another's
state)."""

from __future__ import annotations

import os
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
    """A server someone else started (scripts/python-tests.sh)."""

    api: str
    token: str
    data_dir: Path

    @property
    def database(self) -> Path:
        return self.data_dir / "state.db"


@pytest.fixture(scope="session")
def server() -> Iterator[serve_mod.Serve | External]:
    endpoint = os.environ.get("HARNESS_ENGINE_TEST_ENDPOINT")
    if endpoint:
        token = Path(os.environ["HARNESS_ENGINE_TEST_TOKEN_FILE"]).read_text().strip()
        yield External(endpoint, token, Path(os.environ["HARNESS_ENGINE_TEST_DATA_DIR"]))
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
