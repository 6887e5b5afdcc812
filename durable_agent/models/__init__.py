"""Model clients. One seam: `ModelClient.complete(messages, tools, turn) -> ModelTurn`.

`turn` is the index of this model call within the run (0-based), so a scripted model
answers a resumed run at the right place. Only this package imports `openai`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from durable_agent.messages import Message, ModelTurn


class ModelClient(Protocol):
    name: str

    def complete(
        self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], turn: int
    ) -> ModelTurn: ...
