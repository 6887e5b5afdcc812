"""The command line's own streams and usage errors (one line each, never a traceback), and
its parser's pieces."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, NoReturn, TextIO, cast

from durable_agent.status import EXIT_USAGE
from durable_agent.visible import visible as visible  # (for cli.py: one import there)


class Parser(argparse.ArgumentParser):
    """A usage error is one line, like every other error (subcommand parsers are of this
    class too: argparse makes them with the parent's class)."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"durable-agent: error: {message} (see `{self.prog} --help`)\n")


class Subcommands:
    """`add_parser` of argparse's subparsers, giving only the command this process runs
    (`only`) a parser of its own: building all of them cost a one-step start a fifth of
    what it does beyond its imports. Another command's arguments go to a stand-in that
    keeps nothing. With `only` None (`--help`, a misspelt command) all are built."""

    def __init__(self, sub: Any, only: str | None) -> None:
        self.sub, self.only, self.found = sub, only, False

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        if self.only is None or name == self.only:
            self.found = True
            return cast(argparse.ArgumentParser, self.sub.add_parser(name, **kwargs))
        return cast(argparse.ArgumentParser, _Unused())


class _Unused:
    def __getattr__(self, name: str) -> Any:  # add_argument, add_argument_group, set_defaults
        return lambda *args, **kwargs: self


def open_missing() -> None:
    """Started with stdout or stderr closed (`>&-`), Python has None there: write to
    /dev/null instead of failing with AttributeError at the first print."""
    if sys.stdout is None:
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - lives as long as the process
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115


def silence_stdout() -> None:
    """What is left in stdout's buffer cannot be written either: point the descriptor at
    /dev/null so the interpreter's final flush does not print a second error."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def output_broken() -> bool:
    """Can stdout no longer take what is written to it? (Flushing what waits tells.)"""
    try:
        sys.stdout.flush()
    except (OSError, ValueError):
        return True
    return False


def lenient() -> None:
    """A character the terminal's encoding cannot take (a lone surrogate in a hand-edited
    row) is printed escaped, never a traceback halfway through `show` or `export`."""
    for stream in (sys.stdout, sys.stderr):
        reconfigure = getattr(stream, "reconfigure", None)
        if reconfigure is not None:
            reconfigure(errors="backslashreplace")


def forgiving(out: TextIO) -> TextIO:
    """`out` for what a run prints while it runs and when it ends: the timeline, the header
    lines, the summary, the answer. Output is a view of the run, which is in the store: a
    reader that goes away failed the step being reported (tool_error), left a run just
    created never executed, or made a finished run's exit code 0."""
    if isinstance(out, _Forgiving):
        return cast(TextIO, out)
    known = _WRAPPED.get(id(out))
    if known is None or known._out is not out:  # one per stream: once broken, it stays so
        known = _WRAPPED[id(out)] = _Forgiving(out)
    return cast(TextIO, known)


_WRAPPED: dict[int, _Forgiving] = {}


def is_broken(out: TextIO) -> bool:
    return bool(getattr(out, "broken", False))


class _Forgiving:
    """A stream whose reader may go (`| head`, a closed terminal, a full disk): from the
    first write that fails, nothing more is written, and `broken` says so."""

    def __init__(self, out: TextIO) -> None:
        self._out, self.broken = out, False
        self.encoding = getattr(out, "encoding", None)

    def write(self, text: str) -> int:
        if not self.broken:
            try:
                self._out.write(text)
            except (OSError, ValueError):  # (ValueError: the stream was closed)
                self.broken = True
        return len(text)

    def flush(self) -> None:
        if not self.broken:
            try:
                self._out.flush()
            except (OSError, ValueError):
                self.broken = True
