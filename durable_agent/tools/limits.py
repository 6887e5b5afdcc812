"""Caps on what goes back to the model, and binary-file detection."""

from __future__ import annotations

from durable_agent.capped import read_capped as read_capped  # the tools read as everything does
from durable_agent.encoding import looks_binary  # noqa: F401 - the rule lives with the decoding


def cap_text(text: str, limit: int) -> str:
    """Head and tail of `text` within `limit` characters, with a visible marker between."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    cut = len(text) - head - tail
    return (
        f"{text[:head]}\n[... truncated {cut} of {len(text)} characters ...]\n"
        f"{text[len(text) - tail :]}"
    )


def describe_binary(name: str, size: int, sample: bytes) -> str:
    kinds = {
        b"\x89PNG": "PNG image",
        b"\xff\xd8\xff": "JPEG image",
        b"GIF8": "GIF image",
        b"%PDF": "PDF document",
        b"PK\x03\x04": "zip archive",
        b"\x7fELF": "ELF executable",
        b"\x1f\x8b": "gzip archive",
        b"SQLite format 3": "SQLite database",
    }
    kind = next((v for k, v in kinds.items() if sample.startswith(k)), "binary data")
    return f"{name}: {kind}, {size} bytes (binary file, not shown)"
