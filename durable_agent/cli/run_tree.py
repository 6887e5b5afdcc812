"""Runs and their children (docs/delegation.md): the tree `show` and `list --tree` print,
`cancel` of a parent reaching its children, `approve` of a parent answering its blocked
child's question."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, TextIO

from durable_agent import presentation
from durable_agent.presentation import short
from durable_agent.status import RunStatus
from durable_agent.store.records import RunRecord
from durable_agent.visible import visible


def delegates(run: RunRecord) -> bool:
    """Could the run have a tree? (Without: `show` opens no store for it.)"""
    settings = run.settings if isinstance(run.settings, dict) else {}
    return bool(run.parent_id) or bool(settings.get("delegate"))


def descendants(store: Any, run_id: str, depth: int = 1) -> Iterator[tuple[int, RunRecord]]:
    """(depth, run) of each run below `run_id`, depth first, in the order they were made."""
    for child in store.children(run_id):
        yield depth, child
        yield from descendants(store, child.id, depth + 1)


def root_of(store: Any, run: RunRecord) -> RunRecord:
    while run.parent_id:
        run = store.get_run(run.parent_id)
    return run


def line(run: RunRecord, depth: int, here: str | None = None) -> str:
    cost = presentation.run_cost(run)
    spent = (
        f"${cost:.4f}" if cost is not None else f"{run.prompt_tokens + run.completion_tokens} tok"
    )
    mark = "  ← this run" if run.id == here else ""
    return visible(f"{'  ' * depth}{run.id}  {run.status}  {spent}  {short(run.task, 50)}{mark}")


def print_tree(store: Any, run: RunRecord, out: TextIO) -> None:
    """The whole tree the run is in, each child indented under its parent."""
    root = root_of(store, run)
    print("\nruns", file=out)
    print(line(root, 1, run.id), file=out)
    for depth, child in descendants(store, root.id):
        print(line(child, depth + 1, run.id), file=out)


def cancel_children(store: Any, run_id: str) -> list[str]:
    """Cancel the run's children that have not ended (a child executing stops at its next
    step; one that is not is marked cancelled at once): Store.cancel_children."""
    return list(store.cancel_children(run_id))


def blocked_child(store: Any, run_id: str) -> str | None:
    """The descendant whose pending approval blocks the run, if any."""
    for _depth, child in descendants(store, run_id):
        if child.status == RunStatus.BLOCKED and store.pending_approval(child.id) is not None:
            return str(child.id)
    return None
