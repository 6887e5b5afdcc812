"""The fleet commands' arguments (docs/fleets.md): `queue`, `batch`, `schedule`, and the
queue flags of `start`. Kept out of parser.py so that file gains two lines only."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any


def add_queue_flags(p: argparse.ArgumentParser) -> None:
    """`start`'s queue controls."""
    p.add_argument(
        "--priority",
        type=int,
        metavar="N",
        help="workers claim higher priorities first (default 0; FIFO within one)",
    )
    p.add_argument(
        "--queue-key",
        metavar="KEY",
        help="concurrency key: at most `queue limit KEY N` runs of KEY at once (default 1)",
    )


def add_fleet_commands(sub: Any, command: Callable[[str, str], Any], add_db: Any) -> None:
    p = sub.add_parser(
        "queue",
        help="what waits for a worker, what runs, and why a run waits",
        description="The queue as workers see it: running runs, then waiting ones in the "
        "order a claim takes them (orphans first, then priority, then age), each with why "
        "it waits. `queue limit KEY N` sets how many runs of a queue_key run at once.",
    )
    p.add_argument("action", nargs="?", choices=["show", "limit"], default="show")
    p.add_argument("key", nargs="?", metavar="KEY", help="with `limit`: the queue_key")
    p.add_argument("limit", nargs="?", type=int, metavar="N", help="with `limit`: runs at once")
    add_db(p)
    p.add_argument("--json", action="store_true", help="JSON array on stdout")
    p.set_defaults(func=command("cmd_queue", "queue_command"))
