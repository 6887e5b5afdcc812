"""The garbage collector around a command's start-up.

Start-up makes a few hundred thousand objects that live as long as the process (modules,
classes, the schema, pydantic's validators); the collections they set off find nothing to
free and cost a one-step `start` about a fifteenth of its time. So `cli.main` pauses the
collector for the command, a run's loop starts it again with everything made so far frozen
out of later collections (which then also pass over it every time), and `main` leaves the
collector as it found it for a caller in the same process (the tests, a program).
"""

from __future__ import annotations

import gc


def pause() -> None:
    gc.disable()


def from_here() -> None:
    """The command's own work begins: what exists now lives as long as the process."""
    gc.freeze()
    gc.enable()


def restore() -> None:
    gc.unfreeze()
    gc.enable()
