"""A scripted Strands `Model` for tests: it replays a fixed list of replies (text, or a
tool call) as Strands stream events. No network; the agent loop around it is the real
Strands loop, so tool execution, message appends and session syncs happen as in
production. It records the conversation it was shown on every call."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator, AsyncIterable
from typing import Any

from strands.models.model import Model


class ScriptedModel(Model):
    def __init__(self, replies: list[dict[str, Any]]) -> None:
        self.replies = list(replies)
        self.seen: list[list[dict[str, Any]]] = []

    def update_config(self, **model_config: Any) -> None:
        pass

    def get_config(self) -> Any:
        return {}

    def structured_output(self, output_model, prompt, system_prompt=None, **kwargs) -> AsyncGenerator[Any, None]:  # type: ignore[override]
        raise NotImplementedError("the scripted model has no structured output")

    async def stream(self, messages, tool_specs=None, system_prompt=None, **kwargs: Any) -> AsyncIterable[Any]:  # type: ignore[override]
        self.seen.append(json.loads(json.dumps(messages, default=str)))
        if not self.replies:
            raise AssertionError("the scripted model ran out of replies")
        reply = self.replies.pop(0)
        yield {"messageStart": {"role": "assistant"}}
        if "tool" in reply:
            yield {
                "contentBlockStart": {
                    "start": {"toolUse": {"toolUseId": reply["id"], "name": reply["tool"]}}
                }
            }
            yield {"contentBlockDelta": {"delta": {"toolUse": {"input": json.dumps(reply["input"])}}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use"}}
        else:
            yield {"contentBlockDelta": {"delta": {"text": reply["text"]}}}
            yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "end_turn"}}
