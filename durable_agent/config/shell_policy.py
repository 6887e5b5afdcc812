"""Which shell commands may run without a person saying yes (`--shell ask`).

A command line is allowed only if every simple command in it (split on `;`, `&&`, `||`,
`|`, `&`, newlines, parentheses) starts with an allowlisted prefix, word for word, and
nothing in it looks destructive. Anything the parser cannot vouch for -- command
substitution, writes through redirections, `sudo`, unbalanced quotes, options that name a
program to run, paths outside the workspace (absolute, `~`, `..`) -- is ASK.

This is a tripwire, not the security boundary: `pytest` and `make test` run code from the
workspace, which the agent can edit, and a lexer cannot contain a shell (ANSI-C quoting,
expansions, a planted `.git/config` run by an allowlisted `git status`: issue 11). The
boundary is the OS sandbox (`--sandbox`, os_sandbox.py), which every command runs in,
approved or not. This module only decides who is asked: it keeps a person in the loop for
what is plainly irreversible or unreviewed. Mistakes must only ever go one way: when
unsure, ASK.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from enum import StrEnum

from msgspec import Struct, field


class ShellDecision(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


DEFAULT_ALLOWLIST: tuple[str, ...] = (
    # read-only
    "ls",
    "cat",
    "head",
    "tail",
    "wc",
    "grep",
    "rg",
    "find",
    "pwd",
    "echo",
    "printf",
    "true",
    "cd",
    "tree",
    "file",
    "stat",
    "du",
    "diff",
    "cmp",
    "sort",
    "cut",
    "which",
    "basename",
    "dirname",
    "realpath",
    "date",
    "whoami",
    "uname",
    "git status",
    "git diff",
    "git log",
    "git show",
    "git blame",
    "git grep",
    "git ls-files",
    "git rev-parse",
    "git branch --show-current",
    # tests and checks
    "pytest",
    "python -m pytest",
    "python3 -m pytest",
    ".venv/bin/pytest",
    ".venv/bin/python -m pytest",
    "uv run pytest",
    "npm test",
    "npm run test",
    "yarn test",
    "pnpm test",
    "cargo test",
    "cargo check",
    "go test",
    "go vet",
    "make test",
    "make check",
    "ruff check",
    "mypy",
)

_SEPARATOR_CHARS = " \t\n;&|()"
_SEG = r"[^;&|\n]*"  # the rest of the same simple command
_GIT = r"\bgit(?:\s+-{1,2}[\w.-]+(?:[= ][^\s;&|]+)?)*\s+"  # `git`, then global options
DEFAULT_DESTRUCTIVE: tuple[str, ...] = (
    rf"\brm\s{_SEG}(?<=\s)(?:-[a-zA-Z]*[rR][a-zA-Z]*|--recursive|--no-preserve-root)\b",
    rf"{_GIT}reset\s{_SEG}--hard\b",
    rf"{_GIT}clean\b",
    rf"{_GIT}push\s{_SEG}(?<=\s)(?:--force\b|--force-with-lease\b|-f\b|\+)",
    rf"{_GIT}checkout\s+(?:\S+\s+)?(?:--\s+)?\.(?:\s|$)",
    rf"{_GIT}(?:restore|stash\s+(?:drop|clear))\b",
    rf"{_GIT}branch\s{_SEG}(?<=\s)(?:-D\b|--delete\s+--force\b)",
    r"\bmkfs(?:\.\w+)?\b",
    rf"\bdd\s{_SEG}\bof=",
    rf"\b(?:chmod|chown|chgrp)\s{_SEG}(?<=\s)(?:-[a-zA-Z]*R[a-zA-Z]*|--recursive)\b",
    r">\s*/dev/(?:sd|hd|vd|xvd|nvme|mmcblk|disk)",
    r":\s*\(\s*\)\s*\{[^}]*:\s*\|\s*:",  # :(){ :|:& };:
    r"(?:^|[;&|\n(]|\bsudo)\s*(?:shutdown|reboot|halt|poweroff)\b",  # as a command, not a word
    r"\b(?:curl|wget)\b[^;&\n]*\|\s*(?:sudo\s+)?(?:ba|da|z|k)?sh\b",
    rf"\bfind\s{_SEG}(?<=\s)-delete\b",
    r"\bshred\b",
)

# Options that make an allowlisted read-only command write, delete or run something else.
# Long options are also matched by their unambiguous abbreviations (`sort --compress=prog`:
# getopt and git accept those), and single letters inside a cluster (`sort -uo out`).
_RISKY_OPTIONS: dict[str, frozenset[str]] = {
    "find": frozenset(
        {"-delete", "-exec", "-execdir", "-ok", "-okdir", "-fprint", "-fprint0", "-fprintf", "-fls"}
    ),
    "rg": frozenset({"--pre", "--hostname-bin"}),
    "git": frozenset({"--output", "--ext-diff", "--exec-path", "-O", "--open-files-in-pager"}),
    "sort": frozenset({"-o", "--output", "--compress-program"}),
    "tree": frozenset({"-o"}),
    "ruff": frozenset({"--fix", "--fix-only", "--unsafe-fixes"}),
    "go": frozenset({"-exec", "-toolexec", "-vettool", "-o"}),
    "make": frozenset({"--eval", "-E"}),
    "cargo": frozenset({"--config"}),
}
# Commands whose options are long names after a single dash (`find -exec`, `go test -exec`):
# their words are not clusters of letters, and `--name` means the same as `-name`.
_SINGLE_DASH_LONG = frozenset({"find", "go"})
# Any long option with one of these in its name can name a program to run (`--compress-program`,
# `--open-files-in-pager`, `--hostname-bin`, `--python-executable`, `npm --script-shell`).
_PROGRAM_OPTION = re.compile(r"program|pager|-bin(?:-|$)|exec|command|editor|shell")
# Commands that only print their arguments: a path there is text, not a file read.
_NO_FILE_ARGUMENTS = frozenset(
    {"echo", "printf", "true", "pwd", "basename", "dirname", "which", "whoami", "uname"}
)
_PRIVILEGE = frozenset({"sudo", "doas", "su", "pkexec", "run0"})
# `NAME=value cmd` is fine (`PYTHONPATH=src pytest`), except names that change which
# program runs or inject code into it.
_RISKY_ASSIGNMENT = re.compile(
    r"LD_\w*|PATH|BASH_ENV|ENV|IFS|SHELLOPTS|BASHOPTS|GIT_\w*|"
    r"PAGER|EDITOR|VISUAL|PROMPT_COMMAND|PYTHONSTARTUP"
)
_ASSIGNMENT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)=")
_HARMLESS_TARGETS = frozenset({"/dev/null", "/dev/stdout", "/dev/stderr"})
_HARMLESS_PATHS = frozenset({"/dev/null", "/dev/stdin"})  # arguments that read nothing outside


def decide(
    command: str,
    mode: str,
    allowlist: Sequence[str] = DEFAULT_ALLOWLIST,
    destructive: Sequence[str] = DEFAULT_DESTRUCTIVE,
) -> tuple[ShellDecision, str]:
    """Decide whether `command` runs under shell mode `mode` ("allow", "ask" or "deny").

    Returns the decision and a reason for the person (or model) who sees it.
    """
    if mode == "allow":
        return ShellDecision.ALLOW, "shell mode is allow"
    if mode == "deny":
        return ShellDecision.DENY, "shell mode is deny: commands are disabled"
    if mode != "ask":
        raise ValueError(f"unknown shell mode {mode!r} (allow, ask or deny)")

    for pattern in destructive:
        found = re.search(pattern, command)
        if found:
            return ShellDecision.ASK, f"destructive: `{found.group().strip(_SEPARATOR_CHARS)}`"
    scan = _scan(command)
    if scan.problem:
        return ShellDecision.ASK, scan.problem
    prefixes = [shlex.split(entry) for entry in allowlist]
    for segment in scan.segments:
        problem = _check_simple_command(segment, prefixes)
        if problem:
            return ShellDecision.ASK, problem
    return ShellDecision.ALLOW, "allowlisted"


def _check_simple_command(segment: str, prefixes: list[list[str]]) -> str | None:
    words = shlex.split(segment)  # balanced: _scan checked the quotes
    assigned: list[str] = []
    while words and (assignment := _ASSIGNMENT.match(words[0])):
        if _RISKY_ASSIGNMENT.fullmatch(assignment.group(1)):
            return f"sets {assignment.group(1)}: `{segment}`"
        assigned.append(words.pop(0)[assignment.end() :])
    if not words:
        return None  # only assignments: sets a shell variable, runs nothing
    if words[0] in _PRIVILEGE:
        return f"privilege escalation: `{segment}`"
    if words[0].startswith("./") and "/" in words[0][2:]:
        words[0] = words[0][2:]  # ./.venv/bin/pytest; but never ./ls, a workspace file
    arguments = words[1:]  # before git's globals go: `git -C ../other log` reads elsewhere
    words = _without_git_globals(words)
    if not any(words[: len(prefix)] == prefix for prefix in prefixes):
        return f"not in the allowlist: `{segment}`"
    for word in words[1:]:
        option = _risky_option(words[0], word)
        if option:
            return f"`{option}` can modify files or run programs: `{segment}`"
    if words[0] not in _NO_FILE_ARGUMENTS:
        for word in (*assigned, *arguments):
            outside = _outside_path(word, single_dash_long=words[0] in _SINGLE_DASH_LONG)
            if outside:
                return f"reads outside the workspace: {outside}"
    return None


def _risky_option(command: str, word: str) -> str | None:
    """The option in `word` that can write or run a program for `command`, if any."""
    if not word.startswith("-") or word in ("-", "--"):
        return None
    risky = _RISKY_OPTIONS.get(command, frozenset())
    option = word.split("=", 1)[0]
    if option in risky:
        return option
    if command in _SINGLE_DASH_LONG:
        name = option.lstrip("-")
        if f"-{name}" in risky:
            return option
    elif not option.startswith("--"):  # a cluster of letters: -uo, -Opager, -iOless
        letters = (f"-{c}" for c in word[1:])
        return next((letter for letter in letters if letter in risky), None)
    else:
        name = option[2:]
        if any(long.startswith("--") and long.startswith(option) for long in risky):
            return option  # an abbreviation: `--compress` for `--compress-program`
    if not name.startswith("no-") and _PROGRAM_OPTION.search(name):
        return option
    return None


def _outside_path(word: str, *, single_dash_long: bool = False) -> str | None:
    """`word` (or an option's value in it) if it names a path outside the workspace:
    absolute, from a home directory (`~`), or going up (`..`)."""
    candidates = [word]
    if "=" in word:
        candidates.append(word.split("=", 1)[1])  # --file=/etc/x, DIR=../x
    if word.startswith("-") and not word.startswith("--") and not single_dash_long:
        candidates.extend(word[i:] for i in range(2, len(word)))  # -f/etc/x, -I../include
    for candidate in candidates:
        if candidate in _HARMLESS_PATHS:
            continue
        if candidate.startswith(("/", "~")) or ".." in candidate.split("/"):
            return word
    return None


def _without_git_globals(words: list[str]) -> list[str]:
    """`git --no-pager -C dir log` is `git log`. (`-c key=value` is kept: it can name a
    program to run, so it stays visible to the risky-option check.)"""
    if words[0] != "git":
        return words
    rest = words[1:]
    while rest:
        if rest[0] == "--no-pager":
            rest = rest[1:]
        elif rest[0] == "-C" and len(rest) > 1:
            rest = rest[2:]
        else:
            break
    return ["git", *rest]


class _Scan(Struct):
    segments: list[str] = field(default_factory=list)
    problem: str | None = None


_SEPARATORS = ("&&", "||", "|&", ";", "|", "&", "\n", "(", ")")
_REDIRECTIONS = ("&>>", "&>", ">>", ">|", ">&", "<<<", "<<", "<&", "<>", ">", "<")
_WORD_END = " \t\n;&|<>()"


def _scan(command: str) -> _Scan:
    """Split a line into simple commands the way the shell would (quotes respected),
    dropping redirections after checking them. Sets `problem` for what it will not pass."""
    scan = _Scan()
    current: list[str] = []
    i, n = 0, len(command)

    def end_segment() -> None:
        text = "".join(current).strip()
        if text:
            scan.segments.append(text)
        current.clear()

    while i < n:
        c = command[i]
        if c in "'\"":
            end = _quote_end(command, i)
            if end < 0:
                scan.problem = "unbalanced quotes"
                return scan
            quoted = command[i:end]
            if c == '"' and _has_substitution(quoted):
                scan.problem = f"command substitution: {quoted}"
                return scan
            current.append(quoted)
            i = end
        elif c == "\\":
            current.append(command[i : i + 2] if command[i + 1 : i + 2] != "\n" else " ")
            i += 2
        elif c == "`" or command.startswith(("$(", "<(", ">("), i):
            scan.problem = f"command substitution: `{command[i : i + 24]}`"
            return scan
        elif c == "#" and (not current or current[-1][-1:] in " \t"):
            while i < n and command[i] != "\n":  # a comment: not executed
                i += 1
        elif op := next((r for r in _REDIRECTIONS if command.startswith(r, i)), None):
            _drop_fd_number(current)
            i, target = _read_word(command, i + len(op))
            problem = _redirection_problem(op, target)
            if problem:
                scan.problem = problem
                return scan
        elif sep := next((s for s in _SEPARATORS if command.startswith(s, i)), None):
            end_segment()
            i += len(sep)
        else:
            current.append(c)
            i += 1
    end_segment()
    return scan


def _has_substitution(text: str) -> bool:
    return "$(" in text or "`" in text


def _quote_end(text: str, start: int) -> int:
    """Index just past the quote opened at `start`, or -1 if it is never closed."""
    quote = text[start]
    i = start + 1
    while i < len(text):
        if text[i] == "\\" and quote == '"':
            i += 2
            continue
        if text[i] == quote:
            return i + 1
        i += 1
    return -1


def _read_word(text: str, i: int) -> tuple[int, str]:
    """The redirection target starting at `i` (after blanks), as written."""
    while i < len(text) and text[i] in " \t":
        i += 1
    start = i
    while i < len(text) and text[i] not in _WORD_END:
        if text[i] in "'\"":
            end = _quote_end(text, i)
            i = end if end > 0 else len(text)
        else:
            i += 1
    return i, text[start:i]


def _drop_fd_number(current: list[str]) -> None:
    """`2>/dev/null`: the 2 belongs to the redirection, not to the command's words."""
    digits = 0
    while digits < len(current) and current[-1 - digits].isdigit():
        digits += 1
    if digits and (digits == len(current) or current[-1 - digits] in " \t"):
        del current[len(current) - digits :]


def _redirection_problem(op: str, raw_target: str) -> str | None:
    if _has_substitution(raw_target):
        return f"command substitution in a redirection: `{op}{raw_target}`"
    if op == "<<<":
        return None  # a string
    if op == "<<":
        return "here-document: use write_file for file contents"
    try:
        target = " ".join(shlex.split(raw_target))
    except ValueError:
        target = raw_target
    if op == "<":  # reads a file into the command: `cat < ~/.ssh/id_rsa` is `cat ~/.ssh/id_rsa`
        outside = _outside_path(target)
        return f"reads outside the workspace: {outside}" if outside else None
    if op in (">&", "<&") and (target.isdigit() or target == "-"):
        return None  # 2>&1: duplicates a stream, writes nothing
    if op != "<>" and target in _HARMLESS_TARGETS:
        return None
    return f"redirection writes to a file: `{op}{raw_target}`"
