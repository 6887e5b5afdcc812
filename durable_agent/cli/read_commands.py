"""`list` and `show`, the commands people type most: answered from an SQLite store
through the standard library when it can be (store/sqlite_reads.py: no SQLAlchemy to
import), else through the store (store/runs.py), which also gives every refusal. Both
ways read the same rows into the same records for the same renderers."""

from __future__ import annotations

import json
import sys
from argparse import Namespace

from durable_agent import presentation
from durable_agent.cli import render
from durable_agent.config.store import open_store, store_options
from durable_agent.errors import UsageError
from durable_agent.status import RunStatus
from durable_agent.store import sqlite_reads


def cmd_list(args: Namespace, env: dict[str, str]) -> int:
    limit = min(args.limit, 1 << 31)  # SQL takes no bigger
    statuses = {s.value for s in RunStatus}
    runs = None
    if (not args.status or args.status in statuses) and args.limit >= 1:
        runs = sqlite_reads.list_runs(
            store_options({"db": args.db}, env).db, status=args.status, limit=limit
        )
    if runs is None:
        store = open_store(args.db, env)  # the store first (its refusal comes before the flags')
        if args.status and args.status not in statuses:
            raise UsageError(
                f"unknown status {args.status!r}; one of: {', '.join(s.value for s in RunStatus)}"
            )
        if args.limit < 1:
            raise UsageError("--limit must be at least 1")
        runs = store.list_runs(status=args.status, limit=limit)
    if args.json:
        # The recorded settings are long and the same for most runs: `show --json` has them.
        print(json.dumps([presentation.run_json(r, settings=False) for r in runs], indent=2))
    else:
        render.run_table(runs, sys.stdout, status=args.status)
        if not runs and not args.status:
            _demo_runs_hint(args.db, env)
    return 0


def _demo_runs_hint(db: str | None, env: dict[str, str]) -> None:
    """After `durable-agent demo`, an empty list said "no runs yet": its runs are kept in
    a store of their own (demo/home.py), named here."""
    import shlex

    from durable_agent.config.layers import sqlite_url
    from durable_agent.demo.home import demo_store, invoked_as

    kept = demo_store(env)
    url = sqlite_url(kept)
    if kept.is_file() and store_options({"db": db}, env).db != url:
        print(
            f"the demo's runs are kept in a store of their own: "
            f"{invoked_as()} list --db {shlex.quote(url)}"
        )


def cmd_show(args: Namespace, env: dict[str, str]) -> int:
    found = sqlite_reads.show(store_options({"db": args.db}, env).db, args.run_id)
    if found is None:
        store = open_store(args.db, env)
        run_id = store.find_run_id(args.run_id)
        found = store.get_run(run_id), store.steps(run_id), store.approvals(run_id)
    run, steps, approvals = found
    if args.json:
        print(json.dumps(presentation.show_json(run, steps, approvals), indent=2))
    else:
        render.show(run, steps, approvals, sys.stdout)
    return 0
