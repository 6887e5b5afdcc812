"""`pip install .` (not only an editable install) ships the migrations, the demo and the web
view's own script and stylesheet (it must work offline)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_wheel_contains_migrations_and_demo(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    wheel = next(tmp_path.glob("durable_agent-*.whl"))
    names = set(zipfile.ZipFile(wheel).namelist())
    versions = sorted(p.name for p in (ROOT / "alembic" / "versions").glob("*.py"))
    assert versions
    for name in [
        "durable_agent/migrations/env.py",
        "durable_agent/migrations/script.py.mako",
        *(f"durable_agent/migrations/versions/{v}" for v in versions),
        "durable_agent/demo/script.json",
        "durable_agent/demo/project/calc.py",
        "durable_agent/ui/app.py",
        "durable_agent/ui/static/ui.js",
        "durable_agent/ui/static/ui.css",
    ]:
        assert name in names, f"{name} missing from the wheel"
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert (
        entry
        and "durable-agent = durable_agent.cli.parser:main"
        in zipfile.ZipFile(wheel).read(entry[0]).decode()
    )
