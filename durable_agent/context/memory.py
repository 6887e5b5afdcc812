"""Project memory as the model gets it (pure: no I/O): the instruction files (AGENTS.md...)
read from the user's config folder and from the workspace root down to the task's folder,
concatenated nearest-last under one header, at most MEMORY_CAP bytes of them.

The text is one system message of the history (loop/memory_step.py records it as a step of
kind `memory`); `memory_sha256` of it is the hash a run's fingerprint can name.
"""

from __future__ import annotations

from collections.abc import Sequence

from msgspec import Struct

from durable_agent.messages import Message, sha256_text

MEMORY_CAP = 32 * 1024  # bytes of the files' text; the farthest files' text goes first
MEMORY_HEADER = "# Project memory"


class MemoryFile(Struct, frozen=True):
    path: str  # workspace-relative, or the user's file as ~/...
    sha256: str  # of the file's bytes as read
    size: int  # bytes
    text: str


class Memory(Struct, frozen=True):
    text: str  # the system message's content; "" when no file was found
    sha256: str  # memory_sha256(text)
    files: tuple[MemoryFile, ...]
    cut: int = 0  # bytes of the files' text left out (over MEMORY_CAP)

    def listing(self) -> list[dict[str, object]]:
        """What is recorded of the files: path, sha256 and size (their text is the message)."""
        return [{"path": f.path, "sha256": f.sha256, "bytes": f.size} for f in self.files]


def memory_sha256(text: str) -> str:
    """The hash of a run's memory text (the system message it was given)."""
    return sha256_text(text)


def compose(files: Sequence[MemoryFile], cap: int = MEMORY_CAP, left_out: int = 0) -> Memory:
    """The files, farthest first (the user's, the workspace root, ... the task's folder),
    under one header; over `cap` bytes, the start is cut (the nearest instructions are the
    most specific) and a note says how much. `left_out`: bytes of farther files not read
    at all (the nearer ones were past the cap already), counted in the note."""
    if not files:
        return Memory("", memory_sha256(""), ())
    body = "\n\n".join(f"--- {f.path} ---\n{f.text.rstrip()}" for f in files)
    raw = body.encode("utf-8", "surrogatepass")
    cut = max(0, len(raw) - cap)
    head = [
        MEMORY_HEADER,
        "Instructions from the project's files, nearest folder last: where they differ, the "
        "later ones take precedence. Follow them unless the task says otherwise.",
    ]
    if cut:
        kept = raw[cut:]
        while kept and (kept[0] & 0xC0) == 0x80:  # not in the middle of a character
            kept, cut = kept[1:], cut + 1
        body = kept.decode("utf-8", "surrogatepass")
        cut += left_out
        head.append(
            f"[project memory cut: the first {cut:,} bytes (the farthest files) were left "
            f"out, over the limit of {cap // 1024} KiB]"
        )
    text = "\n".join(head) + "\n\n" + body
    return Memory(text, memory_sha256(text), tuple(files), cut)


def is_memory(message: Message) -> bool:
    """A memory message of the history (a system message after the system prompt)."""
    return message.role == "system" and (message.content or "").startswith(MEMORY_HEADER)


def memory_in_effect(messages: Sequence[Message]) -> str | None:
    """The text of the last memory message of the history: the one the model goes by."""
    for m in reversed(messages[1:]):
        if is_memory(m):
            return m.content or ""
    return None
