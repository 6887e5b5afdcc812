"""Reading a file no further than a cap: what a config file, a workspace snapshot, a
scripted model and the file tools read with (a file named by mistake may be /dev/zero)."""

from __future__ import annotations

from typing import BinaryIO

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
