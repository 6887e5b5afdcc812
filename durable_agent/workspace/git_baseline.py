"""The `snapshot_baseline = "git"` setting: files a git commit already holds are not stored.

In a git checkout, a snapshot records its repository's HEAD commit (`Baseline`: the
commit, the repository's path, its `origin` remote without credentials, the workspace's
folder in it) with the tree (`workspace_trees.git`). A file whose bytes equal the blob
its path has at that commit (git's blob id of the bytes, compared with `git ls-tree`'s) is
not written to `workspace_blobs`: the commit holds it. Everything else (modified and
untracked files, ignored ones the snapshot keeps) is stored as with the default ("store").

Rebuilding (`restore`, `fork`, resume into an empty folder) reads those files from the
repository at that commit: the recorded path when it holds the commit, else a bare clone
of the recorded remote in the user's cache (`$XDG_CACHE_HOME/durable-agent/git/`), then
checks each file's sha256 as for a stored blob. Where neither has the commit, it says so
in one line (GitBaselineUnreachable, exit 2) before anything is written. `.git` is left out
of snapshots as always: a rebuilt folder holds the files, not a repository.

git is run only with commands that read objects (rev-parse, ls-tree, cat-file, config) and
never touch the work tree or the index, so no fsmonitor or hook of the workspace's runs.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import subprocess
import threading
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from msgspec import Struct

from durable_agent.errors import WorkspaceUnreachable
from durable_agent.workspace.manifest import FILE, Manifest

_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",  # a read never takes the index lock
    "GIT_TERMINAL_PROMPT": "0",  # a clone of a remote that wants a password fails, not waits
    "GIT_ASKPASS": "true",
    "LC_ALL": "C",
}
_SAFE = ["-c", "core.fsmonitor=false", "-c", "protocol.ext.allow=never"]
FILE_MODES = (b"100644", b"100755")
CLONE_SECONDS = 3600  # a bare clone of a large remote takes a while; a hung one, not forever


class GitBaselineUnreachable(WorkspaceUnreachable):
    """The commit a snapshot takes files from is in no repository this host can reach."""


class Baseline(Struct, frozen=True):
    commit: str
    repo: str  # the repository's top folder (its work tree), as the snapshot's host saw it
    remote: str  # `origin`'s URL without user or password; "" when none
    prefix: str  # the workspace's folder in the repository ("" at its top)
    format: str = "sha1"  # the repository's object format

    def encoded(self) -> str:
        return json.dumps(
            {
                "commit": self.commit,
                "repo": self.repo,
                "remote": self.remote,
                "prefix": self.prefix,
                "format": self.format,
            },
            sort_keys=True,
        )


def decoded(text: str | None) -> Baseline | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
        return Baseline(
            str(doc["commit"]),
            str(doc["repo"]),
            str(doc.get("remote", "")),
            str(doc.get("prefix", "")),
            str(doc.get("format", "sha1")),
        )
    except (ValueError, KeyError, TypeError):
        return None


def _git(cwd: str | bytes, *args: str, check: bool = True, timeout: float = 120) -> bytes:
    env = {**os.environ, **_ENV}
    done = subprocess.run(
        ["git", *_SAFE, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    if check and done.returncode != 0:
        raise OSError(done.stderr.decode("utf-8", "replace").strip() or f"git {args[0]} failed")
    return done.stdout


def without_credentials(url: str) -> str:
    """A remote's URL as recorded: `https://user:token@host/x` loses `user:token@`."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[1]
        return urllib.parse.urlunsplit(parts._replace(netloc=host))
    return url


def git_blob_id(data: bytes, fmt: str = "sha1") -> str:
    h = hashlib.new(fmt)
    h.update(b"blob %d\0" % len(data))
    h.update(data)
    return h.hexdigest()


def _tree(repo: str | bytes, commit: str, prefix: str) -> dict[bytes, tuple[str, int]]:
    """Path (relative to `prefix`) -> (blob id, size) of the regular files at `commit`."""
    spec = f"{commit}:{prefix}" if prefix else commit
    out = _git(repo, "ls-tree", "-r", "-z", "-l", spec)
    found: dict[bytes, tuple[str, int]] = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        fields = meta.split()
        if len(fields) != 4 or fields[1] != b"blob" or fields[0] not in FILE_MODES:
            continue  # links, submodules: recorded by the manifest as they are, not from here
        found[path] = (fields[2].decode(), int(fields[3]))
    return found


class Head(Struct):
    """A checkout's baseline and its files, found once per process and workspace."""

    baseline: Baseline
    files: dict[bytes, tuple[str, int]]


_heads: dict[bytes, Head | None] = {}
_heads_lock = threading.Lock()


def head_of(root: bytes) -> Head | None:
    """The baseline of the checkout `root` is in (None: not in one, or no commit yet). Found
    at the first snapshot of this process and kept: the run's later snapshots refer to
    the same commit whatever the run commits meanwhile."""
    with _heads_lock:
        if root in _heads:
            return _heads[root]
    try:
        lines = (
            _git(
                root,
                "rev-parse",
                "--show-toplevel",
                "--show-prefix",
                "--show-object-format",
                "HEAD^{commit}",
            )
            .decode()
            .split("\n")
        )
        top, prefix, fmt, commit = lines[0], lines[1].rstrip("/"), lines[2], lines[3]
        remote = _git(root, "config", "--get", "remote.origin.url", check=False).strip()
        found: Head | None = Head(
            Baseline(
                commit,
                top,
                without_credentials(remote.decode("utf-8", "replace")),
                prefix,
                fmt or "sha1",
            ),
            _tree(root, commit, prefix),
        )
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, UnicodeDecodeError):
        found = None
    with _heads_lock:
        _heads[root] = found
    return found


def head_meanwhile(root: bytes) -> Callable[[], Head | None]:
    """head_of in a thread (git's processes run while the scan reads the files); the
    returned call waits for it. The first snapshot of a process alone pays for it."""
    with _heads_lock:
        if root in _heads:
            known = _heads[root]
            return lambda: known
    box: list[Head | None] = []
    thread = threading.Thread(target=lambda: box.append(head_of(root)), daemon=True)
    thread.start()

    def wait() -> Head | None:
        thread.join()
        return box[0] if box else None

    return wait


def covered(head: Head, manifest: Manifest, missing: Mapping[str, bytes]) -> set[str]:
    """The contents of `missing` (sha256 -> bytes) that the baseline commit holds at a path
    the manifest has them at: those need not be stored."""
    out: set[str] = set()
    files, fmt = head.files, head.baseline.format
    for path, entry in manifest.items():
        if entry.kind != FILE or entry.ref in out:
            continue
        data = missing.get(entry.ref)
        at = files.get(path)
        if data is None or at is None or at[1] != len(data):
            continue
        if git_blob_id(data, fmt) == at[0]:
            out.add(entry.ref)
    return out


class Source:
    """A baseline's repository on this host, opened for reading blobs (`git cat-file`)."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline = baseline
        self.lock = threading.Lock()
        self.repo: str | None = None
        self.files: dict[bytes, tuple[str, int]] = {}
        self._proc: subprocess.Popen[bytes] | None = None

    def open(self) -> None:
        """Find a repository that holds the commit, else GitBaselineUnreachable."""
        with self.lock:
            if self.repo is not None:
                return
            b = self.baseline
            tried: list[str] = []
            for repo in self._candidates(tried):
                try:
                    _git(repo, "cat-file", "-e", f"{b.commit}^{{commit}}")
                    self.files = _tree(repo, b.commit, b.prefix)
                except (OSError, subprocess.SubprocessError):
                    continue
                self.repo = repo
                return
            where = " or ".join(tried) or "no repository"
            raise GitBaselineUnreachable(
                f"the workspace snapshot takes its unchanged files from git commit "
                f"{b.commit[:12]}, which is not reachable here ({where}): make the "
                "repository with that commit available at that path, or its remote reachable"
            )

    def _candidates(self, tried: list[str]) -> Iterable[str]:
        b = self.baseline
        tried.append(b.repo)
        if os.path.isdir(b.repo):
            yield b.repo
        if not b.remote:
            return
        cache = _cache_dir() / (hashlib.sha256(b.remote.encode()).hexdigest()[:24] + ".git")
        try:
            if not cache.is_dir():
                cache.parent.mkdir(parents=True, exist_ok=True)
                tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp")
                _git(
                    str(cache.parent),
                    *("clone", "--bare", "--quiet", "--", b.remote, str(tmp)),
                    timeout=CLONE_SECONDS,
                )
                os.replace(tmp, cache)
            else:
                with contextlib.suppress(OSError, subprocess.SubprocessError):
                    _git(str(cache), "cat-file", "-e", f"{b.commit}^{{commit}}")
                    yield str(cache)
                    return
                _git(str(cache), "fetch", "--quiet", "origin", b.commit, timeout=CLONE_SECONDS)
        except (OSError, subprocess.SubprocessError) as exc:
            why = str(exc).splitlines()[-1][:200] if str(exc) else type(exc).__name__
            tried.append(f"remote {b.remote}: {why}")
            return
        tried.append(f"remote {b.remote}")
        yield str(cache)

    def read(self, path: bytes, digest: str) -> bytes | None:
        """The bytes the commit has at `path` if their sha256 is `digest`, else None."""
        self.open()
        with self.lock:
            at = self.files.get(path)
            if at is None:
                return None
            if self._proc is None or self._proc.poll() is not None:
                assert self.repo is not None
                self._proc = subprocess.Popen(
                    ["git", *_SAFE, "cat-file", "--batch"],
                    cwd=self.repo,
                    env={**os.environ, **_ENV},
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
                _open_procs.append(self._proc)
            proc = self._proc
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(at[0].encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                return None
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)  # the newline after the object
        return data if hashlib.sha256(data).hexdigest() == digest else None

    def has_path(self, path: bytes) -> bool:
        """The commit has a file at `path` (its bytes are checked when read)."""
        self.open()
        return path in self.files


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "durable-agent" / "git"


_sources: dict[Baseline, Source] = {}
_sources_lock = threading.Lock()
_open_procs: list[subprocess.Popen[bytes]] = []


def source(baseline: Baseline) -> Source:
    with _sources_lock:
        found = _sources.get(baseline)
        if found is None:
            found = _sources[baseline] = Source(baseline)
        return found


@atexit.register
def _close() -> None:
    for proc in _open_procs:
        with contextlib.suppress(OSError, ValueError):
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(timeout=5)
