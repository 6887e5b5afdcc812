"""gitignore rules (the `exclude` setting, every `.gitignore` in a workspace), compiled so
that matching them takes linear time whatever a command planted."""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

MAX_STARS = 3  # wildcards in one part of a rule, for the backtracking fallback (compile_rules)
# RE2 takes UTF-8 only: the undecodable bytes of a name (U+DC80..U+DCFF, surrogateescape)
# become private-use characters (U+F780..U+F7FF), in rules and paths alike, one for one.
_PRIVATE = {c: c + 0x1B00 for c in range(0xDC80, 0xDD00)}


def compile_rules(lines: Sequence[str]) -> Any:
    """A .gitignore's rules, matched in linear time (`compile_checked` without its list)."""
    return compile_checked(lines)[0]


def compile_checked(lines: Sequence[str]) -> tuple[Any, list[tuple[str, str]]]:
    """A .gitignore's rules, matched in linear time, and the rules left out, each with why.

    The workspace writes them (a command can plant one), the harness matches them against
    every path after every step: with Python's backtracking regexes `*a*a*a*a*ab` held one
    255-byte name for seconds, one more `*a` for minutes. pathspec's RE2 backend
    (google-re2) never backtracks; should RE2 be missing, a rule with more than MAX_STARS
    wildcards in one part is left out. So is a rule the matcher cannot take at all (`[z-a]`,
    a trailing `\\`, a class like `[[:digit:]]` RE2 refuses): git itself may honour it, and
    failing here would stop every snapshot of the run for good. A rule left out ignores
    nothing: its files are snapshotted like the rest. Paths are given through `matchable`."""
    names = _directory_names(lines)
    if names is not None:
        return DirectoryNames(names), []
    import pathspec  # lazy: only rules beyond plain directory names pay for it

    rules = [matchable(line) for line in lines]
    backend = "re2" if _have_re2() else "simple"
    left_out: list[tuple[str, str]] = []
    if backend == "simple":
        left_out = [
            (r, f"more than {MAX_STARS} wildcards in one part") for r in rules if not _bounded(r)
        ]
        rules = [r for r in rules if _bounded(r)]
    with warnings.catch_warnings():  # re's FutureWarning on a `[[` the rule's author wrote
        warnings.simplefilter("ignore")
        parts = _compiled_parts(pathspec, rules, backend, left_out)
    return (parts[0] if len(parts) == 1 else InOrder(parts)), left_out


def _compiled_parts(
    pathspec: Any, rules: list[str], backend: str, left_out: list[tuple[str, str]]
) -> list[Any]:
    """`rules` compiled as one spec, or, when the matcher refuses them (a rule it cannot take;
    RE2's limit on the size of one set, which a few thousand plain names reach), as the
    halves compiled the same way, in order: a refused rule alone is left out, never the
    others (an empty spec would snapshot what the .gitignore keeps out, secrets too)."""
    try:
        return [pathspec.GitIgnoreSpec.from_lines(rules, backend=backend)]
    except Exception as exc:  # noqa: BLE001 - any rule the matcher refuses (re.error, RE2's Error, ValueError)
        if len(rules) <= 1:
            left_out += [(rule, str(exc) or type(exc).__name__) for rule in rules]
            return []
    half = len(rules) // 2
    return _compiled_parts(pathspec, rules[:half], backend, left_out) + _compiled_parts(
        pathspec, rules[half:], backend, left_out
    )


class InOrder:
    """Specs compiled from consecutive runs of one file's rules, matched as that file's rules:
    the last rule that matches decides, so the last part that has a say does."""

    def __init__(self, parts: list[Any]) -> None:
        self.parts = parts

    def check_file(self, path: str) -> Any:
        result: Any = _NO_SAY
        for part in reversed(self.parts):
            result = part.check_file(path)
            if result.include is not None:
                break
        return result


_NO_SAY = SimpleNamespace(include=None)
_YES = SimpleNamespace(include=True)
# A rule `NAME/` of these characters only ignores every directory so named, at any depth, with
# all below it: nothing of gitignore's syntax (wildcards, escapes, `!`, `#`, spaces) is in it.
_PLAIN_DIRECTORY = re.compile(r"[A-Za-z0-9_.-]+/")


def _directory_names(lines: Sequence[str]) -> frozenset[str] | None:
    """The names, when every rule is a plain `NAME/` (blank lines and comments aside), as the
    `exclude` setting's default is: matched as set look-ups, without importing pathspec and
    compiling its expressions (a sixth of a one-step run's start-up, measured)."""
    rules = [line for line in lines if line.strip() and not line.startswith("#")]
    if not all(_PLAIN_DIRECTORY.fullmatch(r) and r not in ("./", "../") for r in rules):
        return None
    return frozenset(r[:-1] for r in rules)


class DirectoryNames:
    """Rules that are all `NAME/`, matched as gitignore matches them (tests/test_ignore_rules.py
    holds this to pathspec): a path is ignored when one of its directories has such a name."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def check_file(self, path: str) -> Any:
        directories = path.split("/")[:-1]  # a directory's path ends in "/": all its parts are
        return _YES if not self.names.isdisjoint(directories) else _NO_SAY


def matchable(text: str) -> str:
    """A rule or a path as the compiled rules take it."""
    return text if text.isascii() else text.translate(_PRIVATE)


@functools.cache
def _have_re2() -> bool:
    """Whether pathspec's RE2 backend works here (pathspec says it is missing its own way)."""
    import pathspec

    try:
        pathspec.GitIgnoreSpec.from_lines([], backend="re2")
    except (ImportError, ValueError):
        return False
    return True


def _bounded(rule: str) -> bool:
    return all(part.replace("**", "").count("*") <= MAX_STARS for part in rule.split("/"))
