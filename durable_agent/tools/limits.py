"""Caps on what goes back to the model, and binary-file detection."""

from __future__ import annotations

from typing import BinaryIO

from durable_agent.tools.encoding import looks_binary  # noqa: F401 - the rule lives with the decoding


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


READ_CHUNK = 1 << 20  # what a file that grew since its fstat is read on by


def read_capped(f: BinaryIO, size_hint: int, cap: int) -> bytes:
    """The bytes of the open (buffered) file from here to its end, or its first cap + 1
    (so the caller sees it is over the cap): asked for as the size fstat gave plus one byte.

    Not `f.read(cap + 1)`: a buffered read of n bytes allocates n up front, and with the
    64 MiB cap that mapped and unmapped 64 MiB for every small file a tool read (about half
    a millisecond, most of a `read_file` step). A file that grew since its fstat is read on
    in chunks, up to the cap; one that shrank simply ends sooner.
    """
    limit = cap + 1
    want = min(max(size_hint, 0) + 1, limit)
    part = f.read(want)
    if len(part) < want or len(part) >= limit:
        return part  # its end (a short read of a regular file is the end), or over the cap
    parts, total = [part], len(part)
    while total < limit:
        part = f.read(min(READ_CHUNK, limit - total))
        if not part:
            break
        parts.append(part)
        total += len(part)
    return b"".join(parts)
