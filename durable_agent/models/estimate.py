"""Token counts for a response that reported no `usage`: an estimate, so budgets keep working.

Without counts `--max-tokens` and `--max-cost` would never trigger. The estimate is the
documented rule of thumb of about four characters per token (rounded up), over the
request's message texts (content and tool calls, plus 3 tokens of framing per message) and
the tool schemas, and over the answer (at least 1 token). Estimated counts are marked
`"estimated": true` in the model step's output.

Not a tokenizer: `tiktoken` would be closer for OpenAI models, but it fetches its encoding
files over the network on first use, and a budget check must not hang on that; the
estimate errs on neither side by much for English text and code. (Compaction's count of a
request before it is sent, context_budget.py, uses tiktoken when the `tokens` extra is
installed and its files load within seconds, and calibrates either with the provider.)
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from durable_agent.messages import Message, ModelTurn, Usage

CHARS_PER_TOKEN = 4
FRAMING_TOKENS = 3  # role and separators of one message


def estimate_usage(
    messages: Sequence[Message], tools: Sequence[dict[str, Any]], answer: ModelTurn
) -> Usage:
    request = [m.content or "" for m in messages]
    request += [c.name + c.arguments for m in messages for c in m.tool_calls]
    if tools:
        request.append(json.dumps(list(tools)))
    reply = [answer.content or ""] + [c.name + c.arguments for c in answer.tool_calls]
    return Usage(
        prompt_tokens=sum(map(_tokens, request)) + FRAMING_TOKENS * len(messages),
        completion_tokens=max(1, sum(map(_tokens, reply))),
        estimated=True,
    )


def _tokens(text: str) -> int:
    return (len(text) + CHARS_PER_TOKEN - 1) // CHARS_PER_TOKEN
