"""LangGraph adapters: `HarnessCheckpointSaver` (checkpointer) and `HarnessStore`
(long-term memory store, on the memory API)."""

from .checkpoint import CODEC, HarnessCheckpointSaver

__all__ = ["CODEC", "HarnessCheckpointSaver"]
