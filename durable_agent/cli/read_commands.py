"""`list` and `show`, the commands people type most, through the store's `RunReads`
(store/reads.py: on an SQLite store no SQLAlchemy to import; the whole store, opened only
when needed, for anything else and for every refusal)."""

from __future__ import annotations

import json
import sys
from argparse import Namespace

from durable_agent import presentation
from durable_agent.cli import render
from durable_agent.config.store import run_reads, store_options
from durable_agent.errors import UsageError
from durable_agent.status import RunStatus


def cmd_list(args: Namespace, env: dict[str, str]) -> int:
    limit = min(args.limit, 1 << 31)  # SQL takes no bigger
    statuses = {s.value for s in RunStatus}
    reads = run_reads(args.db, env)
    if (args.status and args.status not in statuses) or args.limit < 1:
        reads.store()  # the store first (its refusal comes before the flags')
        if args.status and args.status not in statuses:
            raise UsageError(
                f"unknown status {args.status!r}; one of: {', '.join(s.value for s in RunStatus)}"
            )
        raise UsageError("--limit must be at least 1")
    runs = reads.list_runs(status=args.status, limit=limit)
    if getattr(args, "tree", False) and not args.json:
        from durable_agent.cli.run_tree import descendants, line
        from durable_agent.config.store import open_store

        store = open_store(args.db, env)
        for run in runs:
            if not run.parent_id:  # each tree from its root (children listed under it)
                print(line(run, 0))
                for depth, child in descendants(store, run.id):
                    print(line(child, depth))
        return 0
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
    run_id = args.run_id
    if getattr(args, "last", False) or run_id is None:  # the whole store answers `--last`
        from durable_agent.cli.last_run import run_id_of
        from durable_agent.config.store import open_store

        run_id = run_id_of(open_store(args.db, env), args)
    run, steps, approvals = run_reads(args.db, env).show(run_id)
    if args.json:
        print(json.dumps(presentation.show_json(run, steps, approvals), indent=2))
    else:
        render.show(run, steps, approvals, sys.stdout)
        from durable_agent.cli.run_tree import delegates, print_tree

        if delegates(run):  # its parent and children (docs/delegation.md)
            from durable_agent.config.store import open_store

            print_tree(open_store(args.db, env), run, sys.stdout)
    return 0
