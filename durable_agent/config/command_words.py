"""A command line as the simple commands bash would run, each as its words.

Rules match a command prefix word for word (`["git", "push"]`), so the line is split the
way bash splits it: quotes removed (`'…'`, `"…"`, `$'…'`, `\\x`), braces expanded
(`{git,push}` is two words), simple commands separated by `;`, `&&`, `||`, `|`, `&`,
newlines and parentheses, redirections and their targets left out. What a line runs besides its own commands is parsed too and listed as more simple
commands: the bodies of `$( … )`, backticks, `<( … )`, and of `bash -c BODY` (sh, dash,
zsh and ksh too). A substitution's own text stays in the word it is part of (its output is
not known before it runs).

This is policy, not containment: a parser cannot promise what a shell will do (aliases,
functions, `eval`, variables holding commands). The OS sandbox contains every command.
"""

from __future__ import annotations

import bisect
import itertools
import string
import sys
from collections.abc import Iterator

_SHELLS = frozenset({"bash", "sh", "dash", "zsh", "ksh"})
_OPERATORS = ("&&", "||", "|&", ";;", ";", "|", "&", "\n", "(", ")")
_REDIRECTIONS = ("&>>", "&>", ">>", ">|", ">&", "<<<", "<<-", "<<", "<&", "<>", ">", "<")
_WORD_END = " \t\n;&|<>()"
_KEYWORDS = frozenset({"if", "then", "else", "elif", "do", "while", "until", "!", "{"})
_ENDERS = frozenset({"fi", "done", "}", "esac"})


class Unparsable(ValueError):
    """The line is not one bash would run as written (an unclosed quote or substitution)."""


def simple_commands(line: str, *, depth: int = 0) -> list[list[str]]:
    """Every simple command of `line`, in order; substitutions' and `bash -c` bodies'
    after the command that holds them. Raises Unparsable."""
    if depth > 8:
        raise Unparsable("substitutions nested too deeply")
    return _Parser(line, depth).parse()


class _Parser:
    def __init__(self, text: str, depth: int) -> None:
        self.text, self.depth, self.i = text, depth, 0
        self.out: list[list[str]] = []
        self.inner: list[list[str]] = []  # commands found inside the current one's words
        self.heredocs: list[str] = []

    def parse(self) -> list[list[str]]:
        words: list[str] = []
        text, n = self.text, len(self.text)
        while self.i < n:
            c = text[self.i]
            if c in " \t":
                self.i += 1
            elif c == "\\" and text.startswith("\\\n", self.i):
                self.i += 2
            elif c == "#":
                while self.i < n and text[self.i] != "\n":
                    self.i += 1
            elif text.startswith(("<(", ">("), self.i):  # process substitution: a file name
                self.i += 1
                words.append(c + self._substitution_body())
            elif op := next((r for r in _REDIRECTIONS if text.startswith(r, self.i)), None):
                if words and words[-1].isdigit() and text[self.i - 1] not in " \t":
                    words.pop()  # `2>`: the number is the redirection's
                self.i += len(op)
                while self.i < n and text[self.i] in " \t":
                    self.i += 1
                target = self._word()
                if op in ("<<", "<<-"):
                    self.heredocs.append(target)
            elif op := next((s for s in _OPERATORS if text.startswith(s, self.i)), None):
                self._end(words)
                words = []
                self.i += len(op)
                if op == "\n":
                    self._skip_heredocs()
            else:
                words.append(self._word())
        self._end(words)
        return self.out

    def _end(self, words: list[str]) -> None:
        words = [w for word in words for w in _brace_expanded(word)]
        while words and words[0] in _KEYWORDS:
            words = words[1:]
        if words and words[0] in _ENDERS and len(words) == 1:
            words = []
        body = _shell_body(words)
        if body is not None:
            self.out.extend(simple_commands(body, depth=self.depth + 1))
        elif words:
            self.out.append(words)
        self.out.extend(self.inner)
        self.inner = []

    def _skip_heredocs(self) -> None:
        for delimiter in self.heredocs:
            while self.i < len(self.text):
                end = self.text.find("\n", self.i)
                end = len(self.text) if end < 0 else end
                line = self.text[self.i : end]
                self.i = end + 1
                if line.strip("\t") == delimiter:
                    break
        self.heredocs = []

    def _word(self) -> str:
        """One word from `self.i`, its quotes removed; substitutions parsed on the way."""
        text, n = self.text, len(self.text)
        out: list[str] = []
        braces: list[int] = []  # which pieces of `out` are an unquoted {, `,` or }
        quoted = False
        while self.i < n and text[self.i] not in _WORD_END:
            c = text[self.i]
            if c in "{,}":
                braces.append(len(out))  # (appended as a piece of its own, below)
            quoted = quoted or c in "'\"\\" or text.startswith("$'", self.i)
            if c == "'":
                end = text.find("'", self.i + 1)
                if end < 0:
                    raise Unparsable("unclosed single quote")
                out.append(text[self.i + 1 : end])
                self.i = end + 1
            elif c == '"':
                self.i += 1
                out.append(self._double_quoted())
            elif c == "\\":
                if self.i + 1 >= n:
                    self.i += 1  # a lone backslash at the end: bash keeps it
                    out.append("\\")
                elif text[self.i + 1] == "\n":
                    self.i += 2
                else:
                    out.append(text[self.i + 1])
                    self.i += 2
            elif c == "$" and text.startswith("$'", self.i):
                out.append(self._ansi_c())
            elif c == "$" and text.startswith('$"', self.i):
                self.i += 1  # $"…": "…" translated by the locale, none of it a command name
            elif c == "$" or c == "`":
                out.append(self._substitution())
            else:
                out.append(c)
                self.i += 1
        if not braces:
            return "".join(out)
        starts = list(itertools.accumulate(map(len, out), initial=0))
        return _Braced("".join(out), [starts[k] for k in braces], quoted)

    def _double_quoted(self) -> str:
        text, n = self.text, len(self.text)
        out: list[str] = []
        while True:
            if self.i >= n:
                raise Unparsable("unclosed double quote")
            c = text[self.i]
            if c == '"':
                self.i += 1
                return "".join(out)
            if c == "\\" and self.i + 1 < n and text[self.i + 1] in '$`"\\\n':
                if text[self.i + 1] != "\n":
                    out.append(text[self.i + 1])
                self.i += 2
            elif c == "$" or c == "`":
                out.append(self._substitution())
            else:
                out.append(c)
                self.i += 1

    def _ansi_c(self) -> str:
        """`$'…'`: the backslash escapes bash decodes there, numbers too (`$'\\x67it'` is
        `git`); an escape it does not know is kept as written."""
        text, i = self.text, self.i + 2
        out: list[str] = []
        while i < len(text) and text[i] != "'":
            if text[i] == "\\" and i + 1 < len(text):
                decoded, i = _ansi_c_escape(text, i + 1)
                out.append(decoded)
            else:
                out.append(text[i])
                i += 1
        if i >= len(text):
            raise Unparsable("unclosed $'")
        self.i = i + 1
        return "".join(out)

    def _substitution(self) -> str:
        """At `$` or a backtick: `$(…)` and `` `…` `` are parsed as commands; `${…}`,
        `$((…))` and `$NAME` are kept as text."""
        text = self.text
        if text.startswith("$((", self.i):
            end = _matching(text, self.i + 1, "(", ")")
            seen = text[self.i : end + 1]
            self.i = end + 1
            return seen
        if text.startswith("$(", self.i):
            self.i += 1
            return "$" + self._substitution_body()
        if text.startswith("${", self.i):
            end = _matching(text, self.i + 1, "{", "}")
            seen = text[self.i : end + 1]
            self.i = end + 1
            return seen
        if text[self.i] == "`":
            j, body = self.i + 1, []
            while j < len(text) and text[j] != "`":
                if text[j] == "\\" and j + 1 < len(text) and text[j + 1] in "$`\\":
                    body.append(text[j + 1])
                    j += 2
                else:
                    body.append(text[j])
                    j += 1
            if j >= len(text):
                raise Unparsable("unclosed backtick")
            self.inner.extend(simple_commands("".join(body), depth=self.depth + 1))
            seen = text[self.i : j + 1]
            self.i = j + 1
            return seen
        self.i += 1
        return "$"

    def _substitution_body(self) -> str:
        """At `(`: up to its `)`, parsed as commands; returns `(…)` as written."""
        end = _matching(self.text, self.i, "(", ")")
        body = self.text[self.i + 1 : end]
        self.inner.extend(simple_commands(body, depth=self.depth + 1))
        self.i = end + 1
        return f"({body})"


class _Braced(str):
    """A word with unquoted brace characters: where they are, for `_brace_expanded`, and
    whether it had quotes (an empty word it expands to is then kept)."""

    braces: list[int]
    quoted: bool

    def __new__(cls, text: str, braces: list[int], quoted: bool) -> _Braced:
        word = super().__new__(cls, text)
        word.braces, word.quoted = braces, quoted
        return word


_MOST_BRACED = 1024  # words one word may expand to: those past it are left out
_BRACED_ROOM = 1 << 20  # characters it may expand to: the same


def _brace_expanded(word: str) -> list[str]:
    """`word` after bash's brace expansion of its unquoted braces: `{git,push}` is `git` and
    `push`, `pu{s,}h` is `push` and `puh`, `{1..3}` is 1, 2 and 3. Its first words only,
    when it makes more than a command line could want (the command is its first word)."""
    if not isinstance(word, _Braced):
        return [word]
    # bash drops the empty words of an unquoted one: `{,git} push` is `git push`
    return _expand(str(word), word.braces, [_BRACED_ROOM], word.quoted)[:_MOST_BRACED]


def _expand(text: str, marks: list[int], room: list[int], empty: bool) -> list[str]:
    """`text` expanded (`marks`: where its unquoted braces and commas are); `room`: the
    characters it may still make; `empty`: whether empty words are kept."""
    group = _first_group(text, marks)
    if group is None:
        return [text] if text or empty else []
    start, commas, end, items = group
    before, after = text[:start], text[end + 1 :]
    first, last = bisect.bisect_left(marks, start), bisect.bisect_right(marks, end)
    if items is not None:  # a sequence: no marks inside
        pieces: Iterator[tuple[str, list[int]]] = ((item, []) for item in items)
    else:
        bounds = [start, *commas, end]
        pieces = (  # made one at a time: those past the room are never made
            (
                text[a + 1 : b],
                [
                    len(before) + m - a - 1
                    for m in marks[bisect.bisect_right(marks, a) : bisect.bisect_left(marks, b)]
                ],
            )
            for a, b in itertools.pairwise(bounds)
        )
    out: list[str] = []
    for piece, inside in pieces:
        if room[0] <= 0 and not out:
            return [text]  # no room to expand it: as written, rather than no word at all
        if room[0] <= 0 or len(out) >= _MOST_BRACED:
            break
        word = before + piece + after
        room[0] -= len(word)  # (no fewer than the marks it holds: the work below is within it)
        shift = len(before) + len(piece) - end - 1
        joined = marks[:first] + inside + [m + shift for m in marks[last:]]
        out += _expand(word, joined, room, empty)
    return out


def _first_group(
    text: str, marks: list[int]
) -> tuple[int, list[int], int, list[str] | None] | None:
    """The brace group bash expands first: the leftmost `{` whose `}` holds a comma at its
    level or a sequence (`{x}` and an unclosed `{` are literal): where its `{`, commas and
    `}` are, and the sequence's words."""
    open_: list[tuple[int, list[int], int]] = []  # (where, commas, which mark)
    groups: list[tuple[int, list[int], int, list[str] | None]] = []
    for k, m in enumerate(marks):
        c = text[m]
        if c == "{":
            open_.append((m, [], k))
        elif c == "," and open_:
            open_[-1][1].append(m)
        elif c == "}" and open_:
            start, commas, first = open_.pop()
            if commas:
                groups.append((start, commas, m, None))
            elif first == k - 1 and (items := _sequence(text[start + 1 : m])) is not None:
                groups.append((start, [], m, items))
    return min(groups, default=None)


def _sequence(inner: str) -> list[str] | None:
    """`{A..B[..STEP]}`: the words of the sequence (numbers, or letters), else None."""
    parts = inner.split("..")
    if len(parts) not in (2, 3) or (len(parts) == 3 and not _is_int(parts[2])):
        return None
    step = (abs(int(parts[2])) or 1) if len(parts) == 3 else 1
    a, b = parts[0], parts[1]
    if _is_int(a) and _is_int(b):
        lo, hi = int(a), int(b)
        if abs(hi - lo) // step >= _MOST_BRACED:
            return None
        padded = any(x.lstrip("-").startswith("0") and len(x.lstrip("-")) > 1 for x in (a, b))
        width = max(len(a), len(b)) if padded else 0
        numbers = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [f"{n:0{width}d}" if width else str(n) for n in numbers]
    if len(a) == 1 and len(b) == 1 and a.isascii() and b.isascii() and a.isalpha() and b.isalpha():
        lo, hi = ord(a), ord(b)
        codes = range(lo, hi + 1, step) if lo <= hi else range(lo, hi - 1, -step)
        return [chr(c) for c in codes]
    return None


def _is_int(text: str) -> bool:
    return text.lstrip("-").isdigit() and text.count("-") <= 1 and text.isascii()


_C_ESCAPES = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}
_C_HEX = {"x": 2, "u": 4, "U": 8}  # \xHH, \uHHHH, \UHHHHHHHH: at most this many digits


def _ansi_c_escape(text: str, i: int) -> tuple[str, int]:
    """The escape of `$'…'` whose letter is at `i` (after the backslash), decoded, and
    where the text goes on."""
    c = text[i]
    if c in _C_ESCAPES:
        return _C_ESCAPES[c], i + 1
    if c in "01234567":  # \N, \NN, \NNN: octal
        j = i
        while j < len(text) and j < i + 3 and text[j] in "01234567":
            j += 1
        return chr(int(text[i:j], 8) & 0xFF), j
    if c in _C_HEX:
        j = i + 1
        while j < len(text) and j <= i + _C_HEX[c] and text[j] in string.hexdigits:
            j += 1
        code = int(text[i + 1 : j] or "-1", 16)
        if 0 <= code <= sys.maxunicode:  # no digit: bash keeps it as written
            return chr(code), j
    if c == "c" and i + 1 < len(text):  # \cX: the control character of X
        return chr(ord(text[i + 1]) & 0x1F), i + 2
    return "\\" + c, i + 1


def _matching(text: str, start: int, opening: str, closing: str) -> int:
    """Index of the `closing` that matches the `opening` at `start`, quotes respected."""
    level, i = 0, start
    while i < len(text):
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c == "'" and opening == "(":
            end = text.find("'", i + 1)
            if end < 0:
                raise Unparsable("unclosed single quote")
            i = end + 1
            continue
        if c == '"':
            j = i + 1
            while j < len(text) and text[j] != '"':
                j += 2 if text[j] == "\\" else 1
            if j >= len(text):
                raise Unparsable("unclosed double quote")
            i = j + 1
            continue
        if c == opening:
            level += 1
        elif c == closing:
            level -= 1
            if level == 0:
                return i
        i += 1
    raise Unparsable(f"unclosed {opening}")


def _shell_body(words: list[str]) -> str | None:
    """BODY of `bash -c BODY [ARGS…]` (also after `env`, `sudo`…), else None. The shell takes
    the first word after its options as BODY wherever `-c` is among them: `bash -lc BODY`,
    `sh -euo pipefail -c BODY`, `bash -c -e BODY`, `bash --norc -c -- BODY`."""
    rest = strip_wrappers(words)
    if not rest or rest[0].rsplit("/", 1)[-1] not in _SHELLS:
        return None
    i, command = 1, False
    while i < len(rest):
        option = rest[i]
        if option in ("-", "--"):  # the end of the options
            i += 1
            break
        if option.startswith("--"):
            i += 2 if option in _SHELL_LONG_WITH_VALUE else 1
        elif len(option) > 1 and option[0] in "-+":
            command = command or (option[0] == "-" and "c" in option)
            i += 1 + sum(flag in "oO" for flag in option[1:])  # -o NAME, -O NAME
        else:
            break
    return rest[i] if command and i < len(rest) else None


_SHELL_LONG_WITH_VALUE = frozenset({"--rcfile", "--init-file"})


_WRAPPERS = frozenset({"sudo", "doas", "env", "nice", "nohup", "time", "command", "exec"})


def strip_wrappers(words: list[str]) -> list[str]:
    """The command a line runs through `NAME=value`, `env`, `sudo`, `nice`, `nohup`, `time`,
    `command`, `exec` (their own options dropped): `sudo -u x rm -rf /` runs `rm -rf /`."""
    rest = list(words)
    while rest:
        head = rest[0]
        if "=" in head and head.split("=", 1)[0].isidentifier():
            rest = rest[1:]
        elif head.rsplit("/", 1)[-1] in _WRAPPERS:
            rest = rest[1:]
            while rest and rest[0].startswith("-"):
                takes_value = rest[0] in ("-u", "-g", "-n", "-C", "-U")
                rest = rest[2:] if takes_value else rest[1:]
        else:
            break
    return rest
