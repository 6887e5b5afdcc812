"""What a model request holds once the context was compacted (pure: no I/O).

The messages are stored once and never change; a compaction changes only what is SENT:

    request = system prompt + task                     (messages[0:2], always verbatim)
            + the memory messages of messages[2:start]  (project memory: always verbatim)
            + one summary message                      (when a summary replaced messages[2:start])
            + messages[start:], each tool result in `elided` replaced by its stub

A compact step records its boundary in its output (`start`, `summary`, `elided`: message
seqs); replay applies the outputs in order, so the request after a resume is the one that
was sent before it, byte for byte. Between two compactions the view changes only by
appending, so each request extends the previous one exactly (provider prompt caches hit).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from msgspec import Struct, field

from durable_agent.context.memory import is_memory
from durable_agent.messages import HEAD, HistoryHash, Message

SUMMARY_HEADER = (
    "[Summary of the earlier conversation, written when the context was compacted. "
    "Tool results it mentions can be read again with read_output(call_id).]\n"
)


def stub_text(call_id: str, tool_name: str, content: str | None) -> str:
    size = len((content or "").encode("utf-8", "surrogatepass"))
    return (
        f"[output of {tool_name} {call_id} elided: {size:,} bytes; "
        f'call read_output("{call_id}") to see it again]'
    )


def tool_names(messages: Sequence[Message]) -> dict[str, str]:
    """call id -> tool name, over the assistant messages."""
    return {c.id: c.name for m in messages if m.role == "assistant" for c in m.tool_calls}


def stub(message: Message, names: Mapping[str, str]) -> Message:
    cid = message.tool_call_id or ""
    return Message(
        "tool", stub_text(cid, names.get(cid, "tool"), message.content), tool_call_id=cid
    )


class ContextView(Struct):
    summary: str | None = None
    start: int = HEAD
    elided: dict[int, Message] = field(default_factory=dict)  # message seq -> its stub
    compactions: int = 0
    turn: int | None = None  # of the last compaction
    elide_turn: int | None = None  # of the last elide (one per turn: its step key)
    summary_due: bool = False  # the last compaction was an elide that a summary is to follow

    # The request as last built and how many messages it covers: between compactions it only
    # grows, so each call appends the new messages instead of rebuilding (and re-looking-up
    # every elided seq) over the whole history before every model call.
    _built: list[Message] = field(default_factory=list)
    _covered: int = -1

    def request(self, messages: Sequence[Message]) -> list[Message]:
        if 0 <= self._covered <= len(messages):
            self._built.extend(messages[self._covered :])  # (new messages are never elided yet)
        else:
            out = list(messages[:HEAD])
            # Project memory (context/memory.py) is never summarized: the messages a summary
            # replaced keep theirs, before it, verbatim.
            # (The role first: a long run's resume has tens of thousands of places below.)
            below = [m for m in messages[HEAD : self.start] if m.role == "system"]
            out.extend(m for m in below if is_memory(m))
            if self.summary is not None:
                out.append(Message("user", SUMMARY_HEADER + self.summary))
            elided = self.elided
            out.extend(
                elided.get(i) or messages[i] for i in range(max(self.start, HEAD), len(messages))
            )
            self._built = out
        self._covered = len(messages)
        return list(self._built)

    def apply(self, output: Mapping[str, Any], messages: Sequence[Message]) -> None:
        """Take in one compact step's recorded boundary."""
        names: dict[str, str] | None = None
        for seq in output.get("elided") or ():
            if isinstance(seq, int) and 0 <= seq < len(messages) and messages[seq].role == "tool":
                names = names if names is not None else tool_names(messages)
                self.elided[seq] = stub(messages[seq], names)
        if isinstance(output.get("summary"), str) and isinstance(output.get("start"), int):
            self.summary = output["summary"]
            self.start = max(HEAD, min(int(output["start"]), len(messages)))
            self.elided = {i: m for i, m in self.elided.items() if i >= self.start}
        self.compactions += 1
        self._covered = -1  # the request changed: built anew on the next call
        self.turn = output["turn"] if isinstance(output.get("turn"), int) else self.turn
        if output.get("stage") == "elide":
            self.elide_turn = self.turn
        self.summary_due = output.get("then") == "summarize"


def request_hash(request: Sequence[Message]) -> HistoryHash:
    h = HistoryHash()
    for m in request:
        h.add(m)
    return h


def turn_groups(messages: Sequence[Message], lo: int, hi: int) -> list[int]:
    """Seqs in [lo, hi) where a cut may fall: before a message that is not a tool result, so
    that an assistant's tool calls and their results always stay on the same side."""
    return [i for i in range(lo, hi) if messages[i].role != "tool"]
