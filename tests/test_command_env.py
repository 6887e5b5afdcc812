"""What of the host a command sees: an environment built from an allowlist (PATH, HOME,
TERM, TMPDIR, TZ, the locale, and the `command_env` setting), not the host's minus a list of
credential names; the values of the credentials it keeps out are secrets for redaction, so
none reaches the store; and the config file's folder, editors' copies of the file included,
is hidden from commands. Through the real CLI, in the real sandbox."""

from __future__ import annotations

import hashlib
import shutil
import sqlite3
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from sandbox_support import need_bwrap

# Credentials by names the old denylist did not foresee (MYSQL_PWD), and by names it did.
CREDENTIALS = {
    "MYSQL_PWD": "mysql-pw-6d2f1a9b",
    "MY_API_TOKEN": "api-token-83c1e07d",
    "DB_PASSWORD": "db-password-5e9a42c1",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMIxK7MDENGbPxRfiCYEXAMPLEKEY",
}
PASSED = "shared-password-0c4b77e2"  # SHARED_PASSWORD: credential-named, listed exactly


@pytest.fixture
def home() -> Iterator[Path]:
    # Not under /tmp, which the sandbox replaces by an empty one anyway: as a home folder.
    path = Path(tempfile.mkdtemp(prefix="da-cmdenv-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _start(
    home: Path, env: dict[str, str], config: Path, command: str, write_script: Callable[..., str]
) -> tuple[Any, str]:
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text('command_env = ["GIT_AUTHOR_*", "SHARED_PASSWORD"]\n')
    # An editor's backup and swap file beside it, holding what the config held before.
    for copy in (config.name + "~", f".{config.name}.swp", config.name + ".bak"):
        (config.parent / copy).write_text('api_key = "BACKUP-CONTENT-MARKER"\n')
    workspace = home / "ws"
    workspace.mkdir(exist_ok=True)
    store = home / "store.db"
    run_env = {
        **env,
        **CREDENTIALS,
        "SHARED_PASSWORD": PASSED,
        "GIT_AUTHOR_NAME": "Ada Lovelace",
        "GIT_AUTHOR_TOKEN": "author-token-19fe2d",  # matches GIT_AUTHOR_*, credential-named
        "SOME_UNLISTED_SETTING": "unlisted-value",
        "DURABLE_AGENT_CONFIG": str(config),
        "DURABLE_AGENT_DB": f"sqlite:///{store}",
    }
    turns = [
        {"tool_calls": [{"name": "run_command", "arguments": {"command": command}}]},
        {"content": "done"},
    ]
    proc = forked_cli.run(
        ["start", "t", "--model", write_script(turns), "--shell", "allow", "--run-id", "r1"],
        env=run_env,
        cwd=workspace,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    with sqlite3.connect(store) as conn:
        (output,) = conn.execute(
            "SELECT content FROM messages WHERE run_id='r1' AND role='tool'"
        ).fetchone()
    return store, output


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["own folder", "folder holding the workspace"])
def test_a_command_gets_an_allowlisted_environment_and_no_copy_of_the_config(
    env: dict[str, str], home: Path, write_script: Callable[..., str], layout: str
) -> None:
    need_bwrap()
    # Its own folder is hidden whole; a folder that holds the workspace cannot be, and
    # then the config and its copies are hidden one by one.
    config = home / "conf" / "config.toml" if layout == "own folder" else home / "config.toml"
    folder = config.parent
    command = (
        "env; "
        f"cat {folder}/config.toml~ {folder}/.config.toml.swp {folder}/config.toml.bak; "
        f'echo "listed: $(ls -A {folder} | grep -c config.toml)"; '
        'echo "passed: $(printf %s "$SHARED_PASSWORD" | sha256sum | cut -c1-16)"; '
        # The model spells a credential out: it is run as [REDACTED], and never stored.
        f"echo {CREDENTIALS['MYSQL_PWD']}"
    )
    store, output = _start(home, env, config, command, write_script)

    names = {line.split("=", 1)[0] for line in output.splitlines() if "=" in line}
    for name in (*CREDENTIALS, "GIT_AUTHOR_TOKEN", "SOME_UNLISTED_SETTING"):
        assert name not in names, output
    assert {"PATH", "HOME", "PAGER", "DURABLE_AGENT_RUN_ID", "DURABLE_AGENT_CALL_ID"} <= names
    assert "GIT_AUTHOR_NAME=Ada Lovelace" in output  # by the pattern
    assert f"passed: {hashlib.sha256(PASSED.encode()).hexdigest()[:16]}" in output  # by name
    assert "BACKUP-CONTENT-MARKER" not in output
    if layout == "own folder":
        assert "listed: 0" in output, output
    # Nothing of any credential is in the store, in any of its files.
    raw = b"".join(p.read_bytes() for p in store.parent.glob("store.db*"))
    for value in (*CREDENTIALS.values(), PASSED, "author-token-19fe2d"):
        assert value.encode() not in raw, value
    assert b"[REDACTED:MYSQL_PWD]" in raw
