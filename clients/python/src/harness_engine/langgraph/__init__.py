"""LangGraph adapters: `HarnessCheckpointSaver` (checkpointer) and `HarnessStore`
(long-term memory store, on the memory API)."""

from .checkpoint import CODEC, HarnessCheckpointSaver
from .store import HarnessStore

__all__ = ["CODEC", "HarnessCheckpointSaver", "HarnessStore"]
