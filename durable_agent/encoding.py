"""Text and names that are not clean UTF-8: how the tools show them and take them back.

File names. Python hands out a name that is not UTF-8 with each bad byte carried as a
surrogate (`surrogateescape`: byte 0xFF is U+DCFF). Such a string cannot be stored or
sent, so a name is *shown* with each such byte as `\\xHH` (`b'bad\\xff\\xfename.txt'` is
shown `bad\\xff\\xfename.txt`), and a path argument is *read back* the same way: `\\xHH`
with HH from 80 to ff names that raw byte, unless the path exists exactly as written (a
file really named with a backslash). Only bytes >= 0x80 can be undecodable, so the
display never escapes anything else and every ordinary name shows as itself.

File and command text. UTF-8 when it is UTF-8. Otherwise, when nearly nothing in it is
UTF-8 (more undecodable bytes than well-formed multi-byte characters) it is Latin-1 text
(every byte is a character, nothing is lost) and a note says "decoded as latin-1"; else
UTF-8 with each bad byte shown as `\\xHH` and a note with their count. NUL shows as `\\x00`.
A file is binary (described, not shown) when it has a NUL byte or more than 10% control
bytes (C1 controls 0x80..0x9f count too when it is not UTF-8).

Model text written to disk (write_file content, edit_file new_string) is encoded as
UTF-8; lone surrogates, which UTF-8 cannot hold, are written as U+FFFD and the
observation says so.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

_ESCAPED_BYTE = re.compile(r"\\x([89a-fA-F][0-9a-fA-F])")
_SURROGATE = re.compile("[\ud800-\udfff]")
_UNDECODABLE = re.compile("[\udc80-\udcff]")
# Control bytes that text does not have: not \t \n \v \f \r, not ESC (colours in logs).
_C0 = bytes([*range(0x01, 0x09), *range(0x0E, 0x1B), *range(0x1C, 0x20), 0x7F])
_C1 = bytes(range(0x80, 0xA0))
BINARY_CONTROL_RATIO = 0.10


# -- names -------------------------------------------------------------------------------------
def show_name(name: str) -> str:
    """A file name or path for observations: undecodable bytes as `\\xHH` (reversible)."""
    if _UNDECODABLE.search(name) is None:
        return name
    return _UNDECODABLE.sub(lambda m: f"\\x{ord(m.group()) - 0xDC00:02x}", name)


def name_from_arg(workspace: Path | str, path: str) -> str:
    """A path argument as the file system name it means: `show_name` undone, unless the
    path exists exactly as written."""
    if _ESCAPED_BYTE.search(path) is None or os.path.lexists(os.path.join(workspace, path)):
        return path
    return _ESCAPED_BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), path)


def bad_name_char(path: str) -> str | None:
    """Why `path` cannot name a file, or None: a lone surrogate that is not an escaped byte."""
    for ch in _SURROGATE.findall(path):
        if not 0xDC80 <= ord(ch) <= 0xDCFF:
            return f"path contains U+{ord(ch):04X}, a lone surrogate (not valid Unicode)"
    return None


# -- text --------------------------------------------------------------------------------------
def looks_binary(sample: bytes) -> bool:
    """NUL bytes, or too many control bytes for text (see the module docstring)."""
    if not sample:
        return False
    if b"\x00" in sample:
        return True
    controls = _C0 if _is_utf8(sample) else _C0 + _C1
    count = len(sample) - len(sample.translate(None, controls))
    return count > BINARY_CONTROL_RATIO * len(sample)


def _is_utf8(sample: bytes) -> bool:
    try:
        sample.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut at the end of the sample is still UTF-8.
        return exc.start >= len(sample) - 4 and exc.reason == "unexpected end of data"
    return True


def text_encoding(data: bytes) -> str:
    """ "utf-8", "latin-1" or "mixed" (UTF-8 with some bad bytes): the rule in the module docstring."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        text = data.decode("utf-8", errors="surrogateescape")  # each bad byte: one surrogate
        bad = len(_UNDECODABLE.findall(text))
        good = sum(1 for ch in text if ord(ch) > 0x7F) - bad
        return "latin-1" if bad > good else "mixed"
    return "utf-8"


def decode_text(data: bytes) -> tuple[str, str | None]:
    """The text of `data` and a note when it was not UTF-8 (rule in the module docstring)."""
    encoding, note = text_encoding(data), None
    if encoding == "utf-8":
        text = data.decode("utf-8")
    elif encoding == "latin-1":
        text, note = data.decode("latin-1"), "decoded as latin-1: the text is not UTF-8"
    else:
        text = data.decode("utf-8", errors="surrogateescape")
        note = f"{len(_UNDECODABLE.findall(text))} byte(s) that are not UTF-8 shown as \\xHH"
        text = show_name(text)
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    return text, note


def encode_content(text: str) -> tuple[bytes, int]:
    """`text` as UTF-8, and how many lone surrogates were written as U+FFFD."""
    try:
        return text.encode("utf-8"), 0
    except UnicodeEncodeError:
        count = len(_SURROGATE.findall(text))
        return _SURROGATE.sub("\ufffd", text).encode("utf-8"), count


def surrogate_note(count: int) -> str:
    return (
        f"; note: {count} lone surrogate(s) (not valid Unicode) were written as U+FFFD"
        if count
        else ""
    )
