"""Text from a model, a command or a file, made safe to print on a terminal.

A model (or a command's output, or a file's name) controls what the timeline, `show`,
`approve` and the errors print. A carriage return plus `ESC[2K` erased the real command
from a `needs approval` line and printed a harmless one in its place; `ESC[8m` hid the
rest; OSC 52 writes the clipboard; a right-to-left override reorders what is read. So
every control character but tab and newline is printed as its escape (`\\x1b`, as NUL
already is in the store), and so are the bidirectional overrides and isolates.
"""

from __future__ import annotations

_HIDDEN = [
    *range(0x00, 0x09),
    *range(0x0B, 0x20),
    *range(0x7F, 0xA0),
    *range(0x202A, 0x202F),
    *range(0x2066, 0x206A),
]
_ESCAPES = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _HIDDEN}


def visible(text: str) -> str:
    """`text` with every character that could move the cursor, erase, recolour, hide or
    reorder what a terminal shows written as its escape; the rest as it is."""
    return text.translate(_ESCAPES)
