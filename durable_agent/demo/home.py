"""Where `durable-agent demo` keeps what it made, and how its printed commands are spelt.

Each demo run's workspace is kept in `DATA/durable-agent/demo/<run id>/`, and its runs in a
store of their own there (`demo.db`), apart from the user's: the commands the demo prints
(`show`, `list`, `resume`, `export`) name it with `--db`, and find it as long as it is
kept; `durable-agent demo --clean` removes the folder. Cheap to import: `list` asks it.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path


def demo_home(env: Mapping[str, str]) -> Path:
    """Beside the default store (config/layers.py, default_db_url)."""
    base = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "durable-agent" / "demo"


def demo_store(env: Mapping[str, str]) -> Path:
    return demo_home(env) / "demo.db"


def invoked_as(argv0: str | None = None) -> str:
    """The program as the user ran it, for commands to paste back: `.venv/bin/durable-agent`
    when that is what ran (the README's install puts nothing on PATH), plain `durable-agent`
    when PATH finds this very program, `python -m durable_agent` for that spelling."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    name = os.path.basename(argv0)
    if not argv0 or name in ("__main__.py", "-c") or name.endswith(".py"):
        return f"{shlex.quote(sys.executable)} -m durable_agent"
    if os.sep in argv0:
        found = shutil.which(name)
        try:
            if found and os.path.samefile(found, argv0):
                return shlex.quote(name)
        except OSError:
            pass
    return shlex.quote(argv0)
