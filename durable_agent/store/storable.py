"""The store-boundary rule: make any value representable on SQLite and PostgreSQL alike.

PostgreSQL rejects NUL in `text` and `\\u0000` in `jsonb`, UTF-8 (both dialects) cannot
hold a lone surrogate, and JSON has no NaN or Infinity (SQLite's `json_extract` and
PostgreSQL's `jsonb` both refuse the `NaN`/`Infinity` that Python's json writes). A value
that breaks one of these rules would fail the checkpoint on every resume, so every row
goes through `storable` before it is written:

    U+DC80..U+DCFF   a byte that was not UTF-8, carried with `surrogateescape` (file names,
                     command output): written as the text `\\xHH`, the display that the file
                     tools accept back in a path (durable_agent/encoding.py)
    other surrogates lone halves (`"\\ud800"` from a model's JSON): U+FFFD
    NUL              the text `\\x00`
    NaN, ±Infinity   the strings "NaN", "Infinity", "-Infinity"
    bytes            decoded as UTF-8, undecodable bytes as `\\xHH`

Pure and idempotent (`storable(storable(v)) == storable(v)`): the loop applies it to the
in-memory history too (replay.RunState.append), so what runs, what is hashed and what a
resume reads back are the same text. Values that are already clean come back as they are
(the same object), at the cost of one scan per string (memchr for ASCII text).
"""

from __future__ import annotations

import functools
import json
import math
import re
import sys
from datetime import datetime
from typing import Any, overload

_BAD = re.compile("[\x00\ud800-\udfff]")


def _fix(match: re.Match[str]) -> str:
    ch = match.group()
    code = ord(ch)
    if code == 0:
        return "\\x00"
    if 0xDC80 <= code <= 0xDCFF:  # surrogateescape's byte 0x80..0xFF
        return f"\\x{code - 0xDC00:02x}"
    return "\ufffd"


def _clean(text: str) -> bool:
    # isascii() is O(1) in CPython (a flag of the string): ASCII text can only hold a NUL,
    # which `in` finds at memchr speed; the regex scan is for the rest.
    return "\x00" not in text if text.isascii() else _BAD.search(text) is None


def has_bad_text(text: str) -> bool:
    """`text` holds a character `storable_text` would replace."""
    return not _clean(text)


def storable_text(text: str) -> str:
    """`text` with NUL and surrogates replaced as the module docstring says."""
    if _clean(text):
        return text
    return _BAD.sub(_fix, text)


# Values that never need cleaning, checked by exact type first: a checkpoint's rows are
# mostly these, and the walk is the harness's largest CPU cost per step after SQL.
_PLAIN = frozenset({int, bool, type(None), datetime})


@overload
def storable(value: dict[str, Any]) -> dict[str, Any]: ...
@overload
def storable(value: Any) -> Any: ...


def storable(value: Any) -> Any:
    """A copy of `value` (str, list, tuple, dict, float, bytes; others pass through) that
    both dialects can store as text or JSON. Dict keys are cleaned like strings."""
    kind = type(value)
    if kind is str:
        return value if _clean(value) else _BAD.sub(_fix, value)
    if kind in _PLAIN:
        return value
    if kind is dict:
        return {
            (k if type(k) is not str or _clean(k) else _BAD.sub(_fix, k)): (
                v if type(v) in _PLAIN else storable(v)
            )
            for k, v in value.items()
        }
    if kind is list:
        return [v if type(v) in _PLAIN else storable(v) for v in value]
    return _storable_other(value)


def _storable_other(value: Any) -> Any:
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, dict):
        return {
            (storable_text(k) if isinstance(k, str) else k): storable(v) for k, v in value.items()
        }
    if isinstance(value, list | tuple):
        cleaned = [storable(v) for v in value]
        return cleaned if isinstance(value, list) else tuple(cleaned)
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else ("Infinity" if value > 0 else "-Infinity")
    if isinstance(value, bytes | bytearray):
        return storable_text(bytes(value).decode("utf-8", errors="surrogateescape"))
    return value


# Reading a row must never fail, whatever was written into it by hand: SQLite text that is
# not UTF-8 reads with U+FFFD (not "Could not decode to UTF-8 column"), and a JSON column
# that is not JSON reads as its text. (Both ways of reading: store/engine.py, store/sqlite_reads.py.)
lenient_text = functools.partial(str, encoding="utf-8", errors="replace")


# A value this many levels deep is walked by storable well within Python's recursion limit
# (the caller's frames and all); a text that may nest deeper is read by json, as before,
# and shown as written where storable's walk cannot go.
_SHALLOW = 100


def _may_nest(text: Any, bracket: Any, brace: Any) -> bool:
    """`text` holds enough brackets to nest _SHALLOW levels deep (a level takes two chars)."""
    return len(text) >= 2 * _SHALLOW and text.count(bracket) + text.count(brace) >= _SHALLOW


def read_json(text: str | bytes) -> object:
    # msgspec, where the process has loaded it (a run's does: the workspace's manifests),
    # reads 7 times faster than json (a resume reads thousands of values); `list` and `show`
    # do not load it for this (16 ms of their start). What it refuses (NaN, a lone
    # surrogate, 1e400, text that is not JSON) json reads, or shows as written, as before.
    # A value it gives holds no surrogate and no NaN, and a NUL only where the text spells
    # `\u0000`, and it reads values nested deeper than storable's walk recurses: a text
    # that spells a NUL or may nest that deep is read by json, as before.
    fast = sys.modules.get("msgspec.json")
    if fast is not None:
        if isinstance(text, bytes):  # (psycopg gives bytes)
            odd = b"\\u0000" in text or _may_nest(text, b"[", b"{")
        else:
            odd = "\\u0000" in text or _may_nest(text, "[", "{")
        if not odd:
            try:
                return fast.decode(text)
            except (ValueError, RecursionError):  # (msgspec's DecodeError is a ValueError)
                pass
    try:
        # storable: JSON text can spell what a str must not carry further (`"\ud800"`).
        return storable(json.loads(text))
    except (ValueError, RecursionError):  # nested deeper than Python recurses: shown as written
        return text


def is_utf8(text: str) -> bool:
    """False for a str carrying bytes that are not UTF-8 (as surrogates: file names, argv)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
