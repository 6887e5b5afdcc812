"""gitignore rules (the `exclude` setting, every `.gitignore` in a workspace), compiled so
that matching them takes linear time whatever a command planted."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

MAX_STARS = 3  # wildcards in one part of a rule, for the backtracking fallback (compile_rules)
# RE2 takes UTF-8 only: the undecodable bytes of a name (U+DC80..U+DCFF, surrogateescape)
# become private-use characters (U+F780..U+F7FF), in rules and paths alike, one for one.
_PRIVATE = {c: c + 0x1B00 for c in range(0xDC80, 0xDD00)}


def compile_rules(lines: Sequence[str]) -> Any:
    """A .gitignore's rules, matched in linear time. The workspace writes them (a command
    can plant one), the harness matches them against every path after every step: with
    Python's backtracking regexes `*a*a*a*a*ab` held one 255-byte name for seconds, one
    more `*a` for minutes. pathspec's RE2 backend (google-re2) never backtracks; should RE2
    be missing, a rule with more than MAX_STARS wildcards in one part is dropped (its
    files are then snapshotted like the rest). Paths are given through `matchable`."""
    import pathspec  # lazy: only a run that snapshots pays for it

    lines = [matchable(line) for line in lines]
    try:
        return pathspec.GitIgnoreSpec.from_lines(lines, backend="re2")
    except (ImportError, ValueError):  # (pathspec says "re2 is not available" its own way)
        return pathspec.GitIgnoreSpec.from_lines([line for line in lines if _bounded(line)], backend="simple")


def matchable(text: str) -> str:
    """A rule or a path as the compiled rules take it."""
    return text if text.isascii() else text.translate(_PRIVATE)


def _bounded(rule: str) -> bool:
    return all(part.replace("**", "").count("*") <= MAX_STARS for part in rule.split("/"))
