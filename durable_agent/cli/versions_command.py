"""The command-line side of versions (docs/versions.md): `resume --accept-changes / --pin`,
`worker --accept-changes compatible|all`, `list --needs-consent`."""

from __future__ import annotations

import argparse
import json
import sys
from argparse import Namespace
from collections.abc import Mapping
from typing import Any


def add_version_flags(parsers: Mapping[str, argparse.ArgumentParser]) -> None:
    """The flags, added to the commands' parsers that were built (all, or the one run)."""
    if "resume" in parsers:
        p = parsers["resume"]
        p.add_argument(
            "--accept-changes",
            action="store_true",
            help="go on although durable-agent, the prompt, the tools or the model changed "
            "since the checkpoint (the consent is recorded as a step; docs/versions.md)",
        )
        p.add_argument(
            "--pin",
            action="store_true",
            help="go on with the model and tools the run recorded, where that is possible",
        )
    if "worker" in parsers:
        parsers["worker"].add_argument(
            "--accept-changes",
            choices=["compatible", "all"],
            default="compatible",
            help="compatible (default): claim only runs this worker continues without "
            "consent; all: every run, accepting what changed for it (docs/versions.md)",
        )
    if "list" in parsers:
        p = parsers["list"]
        p.add_argument(
            "--needs-consent",
            action="store_true",
            help="only runs stopped because something changed since their checkpoint, with "
            "what changed",
        )
        p.set_defaults(func=_list)


def _list(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.cli.read_commands import cmd_list

    if not args.needs_consent:
        return cmd_list(args, env)
    from durable_agent.config.store import open_store
    from durable_agent.store.versions import needs_consent, pending_question

    store = open_store(args.db, env)
    found = [
        (rid, pending_question(store.engine, rid) or "") for rid in needs_consent(store.engine)
    ]
    found = found[: args.limit]
    if args.json:
        print(json.dumps([{"run_id": rid, "changes": text} for rid, text in found], indent=2))
        return 0
    for rid, text in found:
        print(rid)
        for line in text.splitlines()[1:]:
            print(f"  {line.strip()}")
    if not found:
        print("no run waits for consent to a change", file=sys.stderr)
    return 0


def consent_for_queue(store: Any, run_id: str) -> None:
    """`resume --accept-changes --detach`: the run's question about what changed is
    answered now, so the worker that continues it records the consent."""
    from durable_agent.store.versions import CHANGED

    pending = store.pending_approval(run_id)
    if pending is not None and pending.kind == CHANGED:
        store.decide_approval(pending.id, approved=True, by=f"{_who()} (resume --accept-changes)")


def _who() -> str:
    import getpass

    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "someone"


def resume_policy(args: Namespace, recorded: Mapping[str, Any], settings: Any) -> Any:
    """What this `resume` may go on with: `--accept-changes`, `--pin`, and the settings its
    own flags changed (asked for: compatible)."""
    from durable_agent.loop.versions import VersionPolicy

    given = frozenset(
        k for k, v in settings.redacted_dict().items() if k in recorded and recorded.get(k) != v
    )
    return VersionPolicy(
        accept="all" if getattr(args, "accept_changes", False) else "none",
        pin=bool(getattr(args, "pin", False)),
        by=f"{_who()} (resume --accept-changes)",
        given=given,
    )


def pinned_flags(store: Any, run_id: str, flags: dict[str, Any]) -> None:
    """`--pin`: the model, endpoint and tool protocol the run last recorded, unless a flag
    names another."""
    from durable_agent.store.versions import last_version

    last = last_version(store.engine, run_id)
    if last is None:
        return
    model = last.fingerprint.get("model") or {}
    for flag, part in (
        ("model", "name"),
        ("base_url", "endpoint"),
        ("tool_protocol", "tool_protocol"),
    ):
        if flags.get(flag) is None and model.get(part) is not None:
            flags[flag] = model[part]
