"""Workspace snapshots against secrets and hostile manifests, through the real CLI.

- A file holding a secret the harness knows (its configured API key, a credential
  variable's value), or named as secrets are (`.env`, `*.pem`, an `.npmrc` with a token), is
  never stored: not in the database's bytes, not in any decompressed blob or manifest.
  `diff`, the web view's step diff, `restore` and `fork` say it held a secret; restore and
  fork leave what is on disk at its path as it is.
- Every entry of a stored manifest is checked before restore or fork touches anything: a
  manifest edited in the store (a set-uid mode, a path `.`, a NUL, an unknown kind, a blob
  the store lacks, and whatever hypothesis makes of them) is one line and an exit code, with
  the workspace byte-identical and nothing made where a restore or fork would write.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import sqlite3
import subprocess
import zlib
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from workspace_support import da, picture

HELD = "held a secret; not stored"


def _start(
    env: dict[str, str], ws: Path, model: str, run_id: str
) -> subprocess.CompletedProcess[str]:
    return da(
        ["start", "t", "--workspace", str(ws), "--model", model, "--shell", "allow"]
        + ["--run-id", run_id, "--quiet"],
        env,
        ws,
    )


def _db(env: dict[str, str]) -> Path:
    return Path(env["DURABLE_AGENT_DB"].removeprefix("sqlite:///"))


def _raw_bytes(db: Path) -> bytes:
    return b"".join(
        p.read_bytes()
        for p in (db, db.with_name(db.name + "-wal"), db.with_name(db.name + "-shm"))
        if p.exists()
    )


def _stored(db: Path) -> tuple[list[bytes], list[Any]]:
    """Every blob decompressed, and every manifest row of every tree (full or delta)."""
    with sqlite3.connect(db) as conn:
        blobs = [zlib.decompress(d) for (d,) in conn.execute("SELECT data FROM workspace_blobs")]
        trees = [
            json.loads(zlib.decompress(d))
            for (d,) in conn.execute("SELECT data FROM workspace_trees")
        ]
    rows = [row for doc in trees for row in doc.get("full", []) + doc.get("set", [])]
    return blobs, rows


def _config(env: dict[str, str], text: str) -> None:
    path = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.mark.slow
def test_a_file_holding_a_secret_is_never_stored_and_restore_leaves_it(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    key = "cfg-" + secrets.token_hex(16)  # the configured key: no shape the redactor knows
    token = "svc-" + secrets.token_hex(16)
    env = {**env, "MY_SERVICE_TOKEN": token}
    _config(env, f'api_key = "{key}"\n')
    env_file = f"OPENAI_API_KEY={key}\nMY_SERVICE_TOKEN={token}\n"
    (workspace / ".env").write_text(env_file)
    (workspace / "conf").mkdir()
    (workspace / "conf" / "app.ini").write_text(f"[svc]\ntoken = {token}\n")  # a plain name
    (workspace / "keep.txt").write_text("ordinary text\n")
    script = [
        {
            "tool_calls": [
                {
                    "name": "run_command",
                    "arguments": {
                        "command": "printf 'DEBUG=1\\n' >> .env && printf 'x = 1\\n' >> conf/app.ini"
                        " && echo 'changed by the run' > keep.txt"
                    },
                }
            ]
        },
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "notes.md", "content": "hi\n"}}
            ]
        },
        {"content": "done"},
    ]
    proc = _start(env, workspace, write_script(script), "sec")
    assert proc.returncode == 0, proc.stderr
    db = _db(env)
    with sqlite3.connect(db) as conn:
        (cmd_seq, before, after), *_ = conn.execute(
            "SELECT seq, tree_before, tree_id FROM steps WHERE run_id = 'sec' AND tool_name = "
            "'run_command'"
        ).fetchall()
        last = conn.execute(
            "SELECT MAX(seq) FROM steps WHERE run_id = 'sec' AND tree_id IS NOT NULL"
        ).fetchone()[0]

    # diff (the whole run, one step, as JSON) says so and shows nothing of them.
    whole = da(["diff", "sec"], env, workspace)
    assert whole.returncode == 0, whole.stderr
    for name in (".env", "conf/app.ini"):
        assert f"File a/{name} or b/{name} {HELD}: not shown" in whole.stdout, whole.stdout
    assert "+changed by the run" in whole.stdout and "+hi" in whole.stdout  # others are shown
    stat = da(["diff", "sec", "--stat"], env, workspace)
    held_lines = sorted(
        line.split("|")[0].strip() for line in stat.stdout.splitlines() if HELD in line
    )
    assert held_lines == [".env", "conf/app.ini"], stat.stdout
    as_json = json.loads(da(["diff", "sec", "--json"], env, workspace).stdout)
    assert {c["path"] for c in as_json["changes"] if c.get("secret")} == {".env", "conf/app.ini"}

    # The web view's step diff says the same.
    from ui_support import client

    served = client(env["DURABLE_AGENT_DB"]).get(f"/runs/sec/steps/{cmd_seq}/diff")
    assert served.status_code == 200
    assert f"File a/.env or b/.env {HELD}: not shown" in served.text
    assert "+changed by the run" in served.text

    # restore --force to before the command: the files that held a secret stay as they are
    # on disk now (the person changed .env since), the others go back.
    (workspace / ".env").write_text(env_file + "ROTATED=yes\n")
    kept_env = (workspace / ".env").read_bytes()
    kept_ini = (workspace / "conf" / "app.ini").read_bytes()
    back = da(
        ["restore", "sec", "--tree", before, "--to", str(workspace), "--force"], env, workspace
    )
    assert back.returncode == 0, back.stderr
    assert (workspace / ".env").read_bytes() == kept_env
    assert (workspace / "conf" / "app.ini").read_bytes() == kept_ini
    assert (workspace / "keep.txt").read_text() == "ordinary text\n"
    assert not (workspace / "notes.md").exists()
    assert f"{HELD}, so left as they are on disk: .env, conf/app.ini" in back.stdout, back.stdout

    # fork: the new workspace has the ordinary files, not the withheld ones, and says so.
    fork = da(
        ["fork", "sec", "--at", str(last), "--workspace", str(tmp_path / "f")], env, workspace
    )
    assert fork.returncode == 0, fork.stderr
    assert (tmp_path / "f" / "keep.txt").read_text() == "changed by the run\n"
    assert (tmp_path / "f" / "notes.md").read_text() == "hi\n"
    assert (
        not (tmp_path / "f" / ".env").exists()
        and not (tmp_path / "f" / "conf" / "app.ini").exists()
    )
    assert f"{HELD}, so not written to the new workspace: .env, conf/app.ini" in fork.stderr

    # After all of it (the restore's undo snapshot included), no byte of either secret is in
    # the database: not in its raw bytes, not in any blob or manifest once decompressed.
    blobs, rows = _stored(db)
    raw = _raw_bytes(db)
    for secret in (key.encode(), token.encode()):
        assert secret not in raw
        assert not any(secret in blob for blob in blobs)
        assert secret not in json.dumps(rows).encode()
    # Positive controls: the check sees real contents, and the withheld files are recorded.
    assert any(b"changed by the run" in blob for blob in blobs)
    assert {(r[0], r[1]) for r in rows if r[1] == "secret"} >= {
        (".env", "secret"),
        ("conf/app.ini", "secret"),
    }
    withheld = hashlib.sha256(env_file.encode()).hexdigest()
    assert any(r[0] == ".env" and r[3] == withheld for r in rows)  # recorded by its hash
    assert after is not None


def test_conventional_secret_files_are_withheld_unless_the_setting_is_off(
    tmp_path, env, write_script
) -> None:  # type: ignore[no-untyped-def]
    pem = (
        b"-----BEGIN CERTIFICATE-----\nMIIBnot-a-private-key-"
        + secrets.token_hex(8).encode()
        + b"\n"
    )
    npm_token = b"//registry.npmjs.org/:_authToken=" + secrets.token_hex(12).encode() + b"\n"
    npm_plain = b"registry=https://registry.example.org/\nsave-exact=true\n"
    script = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a\n"}}]},
        {"content": "ok"},
    ]
    found: dict[bool, tuple[set[str], list[bytes]]] = {}
    for withhold in (True, False):
        ws = tmp_path / f"ws-{withhold}"
        (ws / "sub").mkdir(parents=True)
        (ws / "server.pem").write_bytes(pem)
        (ws / "sub" / ".npmrc").write_bytes(npm_token)
        (ws / ".npmrc").write_bytes(npm_plain)
        run_env = {**env, "DURABLE_AGENT_DB": f"sqlite:///{tmp_path / f'{withhold}.db'}"}
        if not withhold:
            _config(run_env, "snapshot_withhold_credential_files = false\n")
        proc = _start(run_env, ws, write_script(script), "pem")
        assert proc.returncode == 0, proc.stderr
        blobs, rows = _stored(_db(run_env))
        found[withhold] = ({r[0] for r in rows if r[1] == "secret"}, blobs)
    withheld, blobs = found[True]
    assert withheld == {"server.pem", "sub/.npmrc"}
    assert pem not in blobs and npm_token not in blobs
    assert npm_plain in blobs  # an .npmrc without a token is ordinary configuration
    withheld, blobs = found[False]
    assert withheld == set()
    assert pem in blobs and npm_token in blobs


# -- hostile manifests ---------------------------------------------------------------------


@pytest.fixture
def tampered(tmp_path, env, workspace, write_script):  # type: ignore[no-untyped-def]
    """A finished run, its last snapshot's id and full stored rows, and a function that
    stores that snapshot with other rows (same id, as a store edited by hand would)."""
    (workspace / "keep.txt").write_text("the person's file\n")
    script = [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "made.txt", "content": "m\n"}}
            ]
        },
        {"content": "ok"},
    ]
    proc = _start(env, workspace, write_script(script), "hm")
    assert proc.returncode == 0, proc.stderr
    (workspace / "keep.txt").write_text("changed since\n")  # what --force would overwrite
    db = _db(env)
    with sqlite3.connect(db) as conn:
        tree, seq = conn.execute(
            "SELECT tree_id, seq FROM steps WHERE run_id = 'hm' AND tree_id IS NOT NULL "
            "ORDER BY seq DESC LIMIT 1"
        ).fetchone()
    from durable_agent.store.blobs import BlobStore
    from durable_agent.store.engine import make_engine
    from durable_agent.workspace import snapshot
    from durable_agent.workspace.manifest import _entry_json

    manifest = snapshot.load(BlobStore(make_engine(env["DURABLE_AGENT_DB"])), tree)
    rows = [_entry_json(p, e) for p, e in sorted(manifest.items())]
    blob_of_keep = next(e.ref for p, e in manifest.items() if p == b"keep.txt")

    def store(new_rows: list[Any]) -> None:
        data = zlib.compress(json.dumps({"full": new_rows}).encode())
        with sqlite3.connect(db) as conn:
            conn.execute(
                "UPDATE workspace_trees SET data = ?, base = NULL, depth = 0 WHERE id = ?",
                (data, tree),
            )

    return tree, seq, rows, blob_of_keep, store


def _refused(
    env: dict[str, str], workspace: Path, tmp_path: Path, tree: str, seq: int, label: str
) -> None:
    """restore (with --force into the workspace, and into a new folder) and fork all refuse
    in one line, and nothing is changed or made."""
    before = picture(workspace)
    runs_before = _runs(env)
    fresh, forked = tmp_path / f"fresh-{label}", tmp_path / f"fork-{label}"
    for args in (
        ["restore", "hm", "--tree", tree, "--to", str(workspace), "--force"],
        ["restore", "hm", "--tree", tree, "--to", str(fresh)],
        ["fork", "hm", "--at", str(seq), "--workspace", str(forked)],
    ):
        proc = da(args, env, workspace)
        assert proc.returncode in (1, 2), (args, proc.returncode, proc.stdout, proc.stderr)
        assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.startswith("durable-agent: error:"), proc.stderr
        assert picture(workspace) == before, (args, proc.stderr)
        assert not fresh.exists() and not forked.exists(), (args, proc.stderr)
    assert _runs(env) == runs_before  # no fork recorded


def _runs(env: dict[str, str]) -> list[Any]:
    with sqlite3.connect(_db(env)) as conn:
        return conn.execute("SELECT id FROM runs ORDER BY id").fetchall()


MISSING = hashlib.sha256(b"in no store").hexdigest()


@pytest.mark.parametrize(
    "label",
    ["setuid", "dot", "nul", "unknown-kind", "missing-blob", "in-git", "absurd-mode"],
)
def test_a_tampered_manifest_is_refused_before_anything_is_touched(
    tmp_path, env, workspace, tampered, label
) -> None:  # type: ignore[no-untyped-def]
    tree, seq, rows, keep_ref, store = tampered
    kept = [r for r in rows if r[0] != "keep.txt"]
    hostile = {
        "setuid": ["keep.txt", "file", 0o6777, keep_ref, "", 18],
        "dot": [".", "file", 0o644, keep_ref, "", 18],
        "nul": ["a\x00b", "file", 0o644, keep_ref, "", 18],
        "unknown-kind": ["keep.txt", "device", 0o644, keep_ref, "", 18],
        "missing-blob": ["keep.txt", "file", 0o644, MISSING, "", 18],
        "in-git": [".git/hooks/pre-commit", "file", 0o755, keep_ref, "", 18],
        "absurd-mode": ["keep.txt", "file", 1 << 70, keep_ref, "", 18],
    }[label]
    store([*kept, hostile])
    _refused(env, workspace, tmp_path, tree, seq, label)


_BAD_PATHS = st.sampled_from(
    [
        ".",
        "",
        "/etc/passwd",
        "..",
        "../out",
        "a/../../out",
        "a//b",
        "a/./b",
        "a/",
        "a\x00b",
        ".git/config",
        "d/.git/hooks/post-checkout",
        "x" * 300,
    ]
)
_BAD_KINDS = st.one_of(st.sampled_from(["device", "FILE", "", "fifo"]), st.integers(), st.none())
_BAD_MODES = st.one_of(
    st.integers(min_value=0o1000),
    st.integers(max_value=-1),
    st.sampled_from(["644", 1.5, True, None]),
)
_BAD_SIZES = st.one_of(st.integers(max_value=-1), st.integers(min_value=1 << 63), st.just("3"))


@st.composite
def _hostile_rows(draw: st.DrawFn, keep_ref: str) -> list[Any]:
    """A manifest row with at least one field no scan records, the rest plausible."""
    path, kind, mode, ref, target, size = "keep.txt", "file", 0o644, keep_ref, "", 18
    bad = draw(
        st.lists(
            st.sampled_from(["path", "kind", "mode", "ref", "link", "size"]),
            min_size=1,
            unique=True,
        )
    )
    if "path" in bad:
        path = draw(_BAD_PATHS)
    if "kind" in bad:
        kind = draw(_BAD_KINDS)
    if "mode" in bad:
        mode = draw(_BAD_MODES)
    if "size" in bad:
        size = draw(_BAD_SIZES)
    if "ref" in bad and "kind" not in bad:
        kind = draw(st.sampled_from(["file", "secret"]))
        ref = draw(st.sampled_from([MISSING, "", "x" * 64, keep_ref.upper(), keep_ref[:-1]]))
        if kind == "secret" and ref == MISSING:  # (a withheld file names no blob)
            ref = "zz"
    if "link" in bad and "kind" not in bad:
        kind, ref, target = "link", "", draw(st.sampled_from(["", "a\x00b"]))
    return [path, kind, mode, ref, target, size]


@pytest.mark.slow
def test_hostile_manifest_entries_never_touch_the_workspace(
    tmp_path, env, workspace, tampered
) -> None:  # type: ignore[no-untyped-def]
    tree, seq, rows, keep_ref, store = tampered
    kept = [r for r in rows if r[0] != "keep.txt"]
    counter = iter(range(1_000_000))

    @settings(
        max_examples=20,
        deadline=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )
    @given(row=_hostile_rows(keep_ref), keep_others=st.booleans())
    def check(row: list[Any], keep_others: bool) -> None:
        store([*(kept if keep_others else []), row])
        _refused(env, workspace, tmp_path, tree, seq, str(next(counter)))

    check()


def test_the_check_refuses_no_path_the_run_itself_snapshotted(
    tmp_path, env, workspace, write_script
) -> None:  # type: ignore[no-untyped-def]
    # A run that excludes nothing snapshots its .git folder: restore checks the manifest
    # against the run's own `exclude`, not the default one.
    _config(env, "exclude = []\n")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    script = [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "a.txt", "content": "a\n"}}]},
        {"content": "ok"},
    ]
    assert _start(env, workspace, write_script(script), "ex").returncode == 0
    with sqlite3.connect(_db(env)) as conn:
        (tree,) = conn.execute(
            "SELECT tree_id FROM steps WHERE run_id = 'ex' AND tree_id IS NOT NULL"
        ).fetchone()
    proc = da(["restore", "ex", "--tree", tree, "--to", str(tmp_path / "back")], env, workspace)
    assert proc.returncode == 0, proc.stderr
    assert picture(tmp_path / "back") == picture(workspace)


def test_a_scan_keeps_no_byte_of_a_withheld_file_or_link(tmp_path: Path) -> None:
    from durable_agent.redact import Redactor
    from durable_agent.workspace.scan import Scanner
    from durable_agent.workspace.secrets import SecretCheck

    token = "svc-" + secrets.token_hex(16)
    (tmp_path / "cfg.yml").write_text(f"token: {token}\n")
    (tmp_path / "link").symlink_to(token)  # a link's target is stored as its content
    (tmp_path / "plain.txt").write_text("plain\n")
    check = SecretCheck(Redactor.from_env({"MY_SERVICE_TOKEN": token}))
    scan = Scanner(tmp_path, [], 1 << 20, check).scan()
    kinds = {p: e.kind for p, e in scan.manifest.items()}
    assert kinds == {b"cfg.yml": "secret", b"link": "secret", b"plain.txt": "file"}
    assert list(scan.contents.values()) == [b"plain\n"]
    assert scan.manifest[b"cfg.yml"].ref == hashlib.sha256(f"token: {token}\n".encode()).hexdigest()
    assert all(token.encode() not in e.target for e in scan.manifest.values())
