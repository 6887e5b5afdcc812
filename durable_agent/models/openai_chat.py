"""Any OpenAI-compatible chat-completions endpoint, with native tool calling.

The client is built with max_retries=0: retries belong to the one classified policy in
retry.py, not to a second layer hidden in the SDK.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from durable_agent.messages import Message, ModelTurn, ToolCall, Usage


class OpenAIChatModel:
    def __init__(self, model: str, *, api_key: str, base_url: str | None,
                 read_timeout: float, connect_timeout: float, temperature: float | None = None) -> None:
        import openai  # imported here: only runs against a real endpoint pay for it

        self.name = model
        self.temperature = temperature
        self.client = openai.OpenAI(
            api_key=api_key, base_url=base_url, max_retries=0,
            timeout=openai.Timeout(read_timeout, connect=connect_timeout),
        )

    def complete(self, messages: Sequence[Message], tools: Sequence[dict[str, Any]], turn: int) -> ModelTurn:
        kwargs: dict[str, Any] = {"model": self.name, "messages": [m.to_api() for m in messages]}
        if tools:
            kwargs["tools"] = list(tools)
        if self.temperature is not None:
            kwargs["temperature"] = self.temperature
        response = self.client.chat.completions.create(**kwargs)
        message = response.choices[0].message
        calls = tuple(
            ToolCall(id=c.id or "", name=c.function.name, arguments=c.function.arguments or "")
            for c in (message.tool_calls or [])
            if getattr(c, "function", None) is not None
        )
        usage = Usage()
        if response.usage is not None:
            usage = Usage(prompt_tokens=response.usage.prompt_tokens or 0,
                          completion_tokens=response.usage.completion_tokens or 0)
        return ModelTurn(content=message.content, tool_calls=calls, usage=usage)
