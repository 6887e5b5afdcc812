"""`pip install .` (not only an editable install) ships the migrations, the demo, the web
view's own script and stylesheet (it must work offline), and the `py.typed` marker: a program
that embeds `Agent` is type-checked against the package's own annotations."""

from __future__ import annotations

import subprocess
import sys
import sysconfig
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
        "durable_agent/py.typed",
    ]:
        assert name in names, f"{name} missing from the wheel"
    entry = [n for n in names if n.endswith("entry_points.txt")]
    assert (
        entry
        and "durable-agent = durable_agent.cli.parser:main"
        in zipfile.ZipFile(wheel).read(entry[0]).decode()
    )


EMBEDDING = """\
from durable_agent import Agent, Outcome, RunView


def run(task: str) -> str:
    agent = Agent(model="scripted:/dev/null", workspace=".", max_steps=3)
    outcome: Outcome = agent.start(task)
    view: RunView = agent.show(outcome.run_id)
    return f"{outcome.status} after {len(view.steps)} steps"
"""


@pytest.mark.slow
def test_a_program_embedding_agent_passes_mypy_strict(tmp_path: Path) -> None:
    """Installed as a user installs it, in the site-packages of an environment of its own
    (where mypy reads a package only if it says it is typed, PEP 561), the package's types
    reach the program: it passes `mypy --strict`, and a wrong use fails."""
    env_dir = tmp_path / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)], check=True)
    python = env_dir / "bin" / "python"
    site = Path(
        subprocess.run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--no-deps",
            "-q",
            "--target",
            str(site),
            str(ROOT),
        ],
        check=True,
        capture_output=True,
    )
    # Its dependencies (pydantic, msgspec, ...) from this environment, by a path line only: the
    # editable install of this checkout is an import hook, which mypy does not run.
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    (tmp_path / "good.py").write_text(EMBEDDING)
    (tmp_path / "bad.py").write_text(EMBEDDING + "\n\nwrong: int = Agent().start('t')\n")

    def mypy(name: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                sys.executable,
                "-m",
                "mypy",
                "--strict",
                "--no-incremental",
                "--config-file",
                "",
                "--python-executable",
                str(python),
                name,
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
        )

    good = mypy("good.py")
    assert good.returncode == 0, good.stdout + good.stderr
    bad = mypy("bad.py")
    assert bad.returncode == 1, bad.stdout + bad.stderr
    assert 'has type "Outcome", variable has type "int"' in bad.stdout
