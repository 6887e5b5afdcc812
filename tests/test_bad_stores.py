"""Bad stores and bad settings: one line `durable-agent: error: ...`, exit 2, no traceback,
and nothing written anywhere else (`--db ''` does not fall back to the default store)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import Result

# Many real processes and generated cases: the full run has them, the fast lane does not.
pytestmark = pytest.mark.slow


def one_error_line(result: Result, *words: str) -> None:
    assert result.code == 2, (result.code, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("durable-agent: error: "), result.stderr
    for word in words:
        assert word in lines[0], lines[0]


@pytest.fixture
def script(write_script: Callable[..., str]) -> str:
    return write_script([{"content": "done"}])


@pytest.fixture
def real_db(cli: Callable[..., Result], script: str, tmp_path: Path) -> Path:
    """A real store with one completed run in it."""
    path = tmp_path / "real.db"
    assert cli("start", "t", "--model", script, "--db", str(path)).code == 0
    return path


# -- files that are not a usable database ------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["show", "x"],
        ["export", "x"],
        ["db", "current"],
        ["db", "upgrade"],
        ["start", "t", "--model", "demo"],
    ],
)
def test_a_text_file_is_not_a_database(
    cli: Callable[..., Result], tmp_path: Path, command: list[str]
) -> None:
    text = tmp_path / "notes.txt"
    text.write_text("these are my notes\n" * 20)
    one_error_line(
        cli(*command, "--db", str(text)),
        "cannot use the store",
        "notes.txt",
        "file is not a database",
    )
    assert text.read_text() == "these are my notes\n" * 20  # not turned into a database either


@pytest.mark.parametrize("command", [["list"], ["resume", "x"], ["start", "t", "--model", "demo"]])
def test_a_truncated_database(
    cli: Callable[..., Result], real_db: Path, tmp_path: Path, command: list[str]
) -> None:
    cut = tmp_path / "cut.db"
    cut.write_bytes(real_db.read_bytes()[:100])  # the header survives, the pages are gone
    one_error_line(cli(*command, "--db", str(cut)), "cannot use the store", "cut.db", "malformed")


@pytest.mark.parametrize("command", [["list"], ["start", "t", "--model", "demo"]])
def test_a_device_or_a_folder_is_not_a_database(
    cli: Callable[..., Result], tmp_path: Path, command: list[str]
) -> None:
    """SQLite opens /dev/null and then fails every write with "disk I/O error": that is a
    wrong --db (exit 2 at once), not a store that went away (retried, then exit 7)."""
    for path in ("/dev/null", str(tmp_path)):
        one_error_line(cli(*command, "--db", path), "cannot use the store", "not a regular file")


def test_a_folder_that_is_a_file(cli: Callable[..., Result], tmp_path: Path) -> None:
    blocker = tmp_path / "blocker"
    blocker.write_text("x")
    one_error_line(
        cli("list", "--db", str(blocker / "sub" / "store.db")), "cannot create the database folder"
    )


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    """A read-only file system (a tmpfs remounted ro): unwritable even for root, unlike chmod."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root to mount a read-only tmpfs")
    mnt = tmp_path / "ro"
    mnt.mkdir()
    if (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True
        ).returncode
        != 0
    ):
        pytest.skip("cannot mount a tmpfs here")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def make_read_only(mnt: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(mnt)], check=True)


def test_a_new_store_in_an_unwritable_folder(
    cli: Callable[..., Result], read_only_dir: Path, script: str
) -> None:
    make_read_only(read_only_dir)
    for command in (["list"], ["start", "t", "--model", script]):
        one_error_line(
            cli(*command, "--db", str(read_only_dir / "new.db")),
            "cannot use the store",
            "unable to open database file",
        )


def test_an_existing_store_on_a_read_only_file_system(
    cli: Callable[..., Result], read_only_dir: Path, real_db: Path, script: str
) -> None:
    shutil.copy(real_db, read_only_dir / "store.db")
    make_read_only(read_only_dir)
    one_error_line(
        cli("start", "t", "--model", script, "--db", str(read_only_dir / "store.db")),
        "cannot use the store",
    )


def test_list_and_show_of_a_store_on_a_read_only_file_system(
    cli: Callable[..., Result], read_only_dir: Path, real_db: Path
) -> None:
    """A backup or a snapshot: the plain read (store/sqlite_reads.py) opens it as it is
    (immutable: nobody can write it there), where SQLite would need to create its -shm.
    What it cannot answer (a run that is not there) is refused in one line, saying why."""
    shutil.copy(real_db, read_only_dir / "store.db")
    make_read_only(read_only_dir)
    db = ["--db", str(read_only_dir / "store.db")]
    listed = cli("list", "--json", *db)
    assert listed.code == 0, listed.stderr
    (run,) = json.loads(listed.stdout)
    shown = cli("show", run["id"], *db)
    assert shown.code == 0 and run["id"] in shown.stdout, shown.stderr
    one_error_line(cli("show", "x", *db), "cannot use the store", "its folder is read-only")
    one_error_line(cli("export", run["id"], *db), "cannot use the store", "its folder is read-only")
    assert sorted(p.name for p in read_only_dir.iterdir()) == ["store.db"]  # no -shm, no -wal made


# -- settings ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "command",
    [
        ["list"],
        ["show", "x"],
        ["db", "current"],
        ["worker", "--once"],
        ["start", "t", "--model", "demo"],
        ["resume", "x"],
        ["demo"],
    ],
)
def test_an_empty_db_flag_is_an_error_not_the_default_store(
    cli: Callable[..., Result], env: dict[str, str], command: list[str]
) -> None:
    result = cli(*command, "--db", "")
    one_error_line(result, "the store URL is empty")
    assert not Path(
        env["XDG_DATA_HOME"], "durable-agent"
    ).exists()  # the default store was not touched


@pytest.mark.parametrize(
    "url",
    [
        "sqlite://",
        "sqlite:///:memory:",
        ":memory:",
        "sqlite:///",
        "sqlite+pysqlite:///",
        "sqlite:///?timeout=5",
        "sqlite:///file::memory:?uri=true",
        "sqlite:///file:x?mode=memory&cache=shared&uri=true",
    ],
)
def test_an_in_memory_store_is_refused(cli: Callable[..., Result], script: str, url: str) -> None:
    # It would print "resume with ..." for a run that is gone when the process ends.
    one_error_line(cli("start", "t", "--model", script, "--db", url), "in memory", "keeps nothing")


@pytest.mark.parametrize("query", ["mode=ro", "cache=shared&timeout=5", "immutable=1"])
def test_an_option_sqlite_would_ignore_is_refused_not_warned_about(
    cli: Callable[..., Result], script: str, tmp_path: Path, query: str
) -> None:
    """`?mode=ro` without uri=true: SQLAlchemy warned in three lines and opened the file for
    writing anyway. Options it does read, and any option of an SQLite URI, still work."""
    db = tmp_path / "x.db"
    for args in (["list"], ["start", "t", "--model", script]):
        one_error_line(
            cli(*args, "--db", f"sqlite:///{db}?{query}"), "only in an SQLite URI", "uri=true"
        )
    assert not db.exists()
    assert cli("start", "t", "--model", script, "--db", f"sqlite:///{db}?timeout=5").code == 0
    listed = cli("list", "--db", f"sqlite:///file:{db}?mode=ro&uri=yes")
    assert listed.code == 0 and "completed" in listed.stdout and "Warning" not in listed.stderr, (
        listed
    )


def test_a_store_name_that_is_not_utf8_is_refused_in_one_line(
    cli: Callable[..., Result], script: str, tmp_path: Path
) -> None:
    """It crashed `start` with a UnicodeEncodeError after creating an empty file."""
    name = os.fsdecode(str(tmp_path).encode() + b"/st\xff.db")
    for args in (["start", "t", "--model", script], ["list"], ["show", "x"]):
        one_error_line(cli(*args, "--db", name), "not valid UTF-8")
    assert list(tmp_path.glob("st*")) == []


@pytest.mark.parametrize(
    "flag",
    [
        ["--max-seconds", "inf"],
        ["--max-seconds", "nan"],
        ["--max-seconds=-inf"],
        ["--max-cost", "inf"],
        ["--max-cost", "nan"],
    ],
)
def test_non_finite_budgets_are_refused(
    cli: Callable[..., Result],
    script: str,
    flag: list[str],
    sql: Callable[..., list[object]],
    db_path: Path,
) -> None:
    field = flag[0].split("=")[0][2:].replace("-", "_")
    one_error_line(cli("start", "t", "--model", script, *flag), "finite", field)
    assert not db_path.exists() or sql("SELECT count(*) FROM runs") == [(0,)]


def test_non_finite_numbers_in_the_config_file_are_refused(
    cli: Callable[..., Result], script: str, tmp_path: Path
) -> None:
    for line in (
        "max_seconds = inf",
        "max_cost = nan",
        "command_timeout_s = inf",
        "lease_seconds = nan",
        'prices."m" = {input_per_mtok = inf, output_per_mtok = 1.0}',
    ):
        config = tmp_path / "config.toml"
        config.write_text(line + "\n")
        result = cli(
            "start", "t", "--model", script, extra_env={"DURABLE_AGENT_CONFIG": str(config)}
        )
        one_error_line(result, "finite")


def test_resume_refuses_a_non_finite_raise_and_keeps_the_recorded_budget(
    cli: Callable[..., Result], write_script: Callable[..., str], sql: Callable[..., list[object]]
) -> None:
    model = write_script(
        [{"tool_calls": [{"name": "list_files", "arguments": {}}]}, {"content": "done"}]
    )
    started = cli(
        "start", "t", "--model", model, "--max-steps", "1", "--max-seconds", "30", "--json"
    )
    assert started.code == 3, started.stderr
    run_id = started.json()["run_id"]
    one_error_line(cli("resume", run_id, "--max-seconds", "inf"), "finite")
    # The documented query over the recorded settings still reads every run.
    assert sql("SELECT json_extract(settings, '$.max_seconds') FROM runs") == [(30.0,)]
    assert json.loads(sql("SELECT settings FROM runs")[0][0])["max_seconds"] == 30.0


@pytest.mark.parametrize(
    "flag",
    [
        ["--lease-seconds", "inf"],
        ["--lease-seconds", "nan"],
        ["--poll", "nan"],
        ["--poll", "inf"],
        ["--poll", "1e300"],
        ["--lease-seconds", "1e12"],
    ],
)
def test_worker_refuses_non_finite_times(cli: Callable[..., Result], flag: list[str]) -> None:
    one_error_line(cli("worker", "--once", *flag))
