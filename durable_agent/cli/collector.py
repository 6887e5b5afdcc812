"""The garbage collector around a command's start-up.

Start-up makes a few hundred thousand objects that live as long as the process (modules,
classes, the schema, pydantic's validators); the collections they set off find nothing to
free and cost a one-step `start` about a tenth of its wall time (3% of its instructions:
the rest is memory traffic). So `cli.main` pauses the collector for the command, a run's
loop starts it again with everything made so far frozen out of later collections (which
then also pass over it every time), and `main` leaves the collector as it found it for a
caller in the same process (the tests, a program).

When the command is the process's own, the process ends with it: Python's finalization
would then collect twice over everything start-up made, only to free what the OS frees
anyway (110M instructions of a one-step `start`, 7% of it). `process_ends` closes what must
be closed (the stores' connections) and freezes everything out of those collections.
"""

from __future__ import annotations

import gc
import sys

# One entry for each `main` under way: was the collector on, and was nothing frozen (then
# what is frozen later is ours to unfreeze)?
_found: list[tuple[bool, bool]] = []


def pause() -> None:
    _found.append((gc.isenabled(), gc.get_freeze_count() == 0))
    gc.disable()


def from_here() -> None:
    """The command's own work begins: what exists now lives as long as the process.
    (A caller that froze objects itself keeps them as they are: nothing more is frozen.)"""
    if not _found:
        return  # not under `main`: the collector is the caller's
    if _found[-1][1]:
        gc.freeze()
    gc.enable()


def restore() -> None:
    """As `pause` found it: on or off, and only what `from_here` froze unfrozen."""
    enabled, nothing_frozen = _found.pop() if _found else (True, True)
    if nothing_frozen:
        gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def process_ends() -> None:
    """The process's own command is over: close the stores' connections (SQLite checkpoints
    its WAL on the last close), then leave every object to the process's exit (nothing made
    so far is collected again: the finalizer's collections found nothing worth their cost)."""
    # After the freeze no finalizer of an object in a reference cycle runs: a buffered file
    # must be closed (or written with `with`) before this, not left to the collector.
    engines = sys.modules.get("durable_agent.store.engine")  # not loaded: no store was opened
    if engines is not None:
        engines.dispose_all()
    gc.freeze()
