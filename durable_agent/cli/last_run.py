"""RUN_ID or `--last` (`continue`, `resume`, `show`): the newest run started in this folder
(its workspace is this folder, else the nearest folder that holds it and has runs)."""

from __future__ import annotations

from argparse import Namespace
from pathlib import Path
from typing import Any

from durable_agent.errors import UsageError


def run_id_of(store: Any, args: Namespace) -> str:
    """RUN_ID (a unique prefix too), or `--last`: the newest run whose workspace is this folder."""
    given, last = getattr(args, "run_id", None), getattr(args, "last", False)
    if last and given is not None:
        raise UsageError("give a RUN_ID or --last, not both")
    if last:
        here = Path.cwd().resolve()
        return str(store.last_run_id(str(here), within=[str(p) for p in here.parents]))
    if given is None:
        raise UsageError("give a RUN_ID (or --last: the newest run started in this folder)")
    return str(store.find_run_id(given))
