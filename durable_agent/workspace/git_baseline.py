"""The `snapshot_baseline = "git"` setting: files a git commit already holds are not stored.

In a git checkout, a snapshot records its repository's HEAD commit (`Baseline`: the
commit, the repository's path, its `origin` remote without credentials, the workspace's
folder in it) with the tree (`workspace_trees.git`). A file whose bytes are the blob its
path has at that commit is named in the manifest by `git:` and that blob id (GIT_REF), not
by a sha256, and is not written to `workspace_blobs`: the commit holds it. The scanner
(scan.py) takes those ids on git's word for the tracked files git says are clean (as `git
status` does: `ls-files -s`, `diff-files`; head_and_clean) without reading them, and by
git's blob id of the bytes for a file it reads. Everything else (modified, untracked and
staged-but-uncommitted files, ignored ones the snapshot keeps) is stored as with the
default ("store").

Rebuilding (`restore`, `fork`, resume into an empty folder) reads the `git:` files by id
(`cat-file --batch`) from the repository at its recorded path when it holds the commit,
else a bare clone of the recorded remote in the user's cache
(`$XDG_CACHE_HOME/durable-agent/git/`), and checks git's hash of each. Where neither has
the commit, it says so in one line (GitBaselineUnreachable, exit 2) before anything is
written. `.git` is left out of snapshots as always: a rebuilt folder holds the files, not a
repository.

git is run only with commands that read (rev-parse, config, ls-tree, ls-files, diff-files,
cat-file), with fsmonitor and optional locks off: the work tree and the index are never
written, and no fsmonitor or hook of the workspace's runs.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import os
import re
import subprocess
import threading
import urllib.parse
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from msgspec import Struct

from durable_agent.errors import WorkspaceUnreachable

_ENV = {
    "GIT_OPTIONAL_LOCKS": "0",  # a read never takes the index lock
    "GIT_TERMINAL_PROMPT": "0",  # a clone of a remote that wants a password fails, not waits
    "GIT_ASKPASS": "true",
    "LC_ALL": "C",
}
_SAFE = ["-c", "core.fsmonitor=false", "-c", "protocol.ext.allow=never"]
FILE_MODES = (b"100644", b"100755")
# The attributes by which a file's bytes on disk may differ from its blob's while git calls
# it clean (convert.c): such a file is read, not vouched for.
CONVERTING = frozenset((b"text", b"crlf", b"eol", b"ident", b"filter", b"working-tree-encoding"))
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


_COMMIT = {"sha1": re.compile("[0-9a-f]{40}"), "sha256": re.compile("[0-9a-f]{64}")}


def decoded(text: str | None) -> Baseline | None:
    if not text:
        return None
    try:
        doc = json.loads(text)
        found = Baseline(
            str(doc["commit"]),
            str(doc["repo"]),
            str(doc.get("remote", "")),
            str(doc.get("prefix", "")),
            str(doc.get("format", "sha1")),
        )
    except (ValueError, KeyError, TypeError):
        return None
    # Only an object id: the commit is an argument of `git fetch`, where a row edited to
    # `--upload-pack=...` would run a command.
    if _COMMIT.get(found.format) is None or not _COMMIT[found.format].fullmatch(found.commit):
        return None
    return found


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


GIT_REF = "git:"  # a manifest's content id that is a git blob id (the commit holds the bytes)


def git_ref(blob_id: str) -> str:
    return GIT_REF + blob_id


def blob_id_of(ref: str) -> str | None:
    """The git blob id a manifest's content id names (None: a sha256, the store holds it)."""
    return ref[len(GIT_REF) :] if ref.startswith(GIT_REF) else None


def ref_format(ref: str) -> str:
    """The hash a `git:` content id was made with (its length tells)."""
    return "sha256" if len(ref) == len(GIT_REF) + 64 else "sha1"


def _tree(repo: str | bytes, commit: str, prefix: str) -> dict[bytes, str]:
    """Path (relative to `prefix`) -> blob id of the regular files at `commit`."""
    spec = f"{commit}:{prefix}" if prefix else commit
    return _tree_of(_git(repo, "ls-tree", "-r", "-z", spec))


def _tree_of(out: bytes) -> dict[bytes, str]:
    found: dict[bytes, str] = {}
    for record in out.split(b"\0"):
        if not record:
            continue
        meta, _, path = record.partition(b"\t")
        fields = meta.split()
        if len(fields) < 3 or fields[1] != b"blob" or fields[0] not in FILE_MODES:
            continue  # links, submodules: recorded by the manifest as they are, not from here
        found[path] = fields[2].decode()
    return found


class Head(Struct):
    """A checkout's baseline and its files, found once per process and workspace."""

    baseline: Baseline
    files: dict[bytes, str]  # path (relative to the workspace) -> blob id at the commit


_heads: dict[bytes, Head | None] = {}
_heads_lock = threading.Lock()


def head_of(root: bytes) -> Head | None:
    """The baseline of the checkout `root` is in (None: not in one, or no commit yet). Found
    at the first snapshot of this process and kept: the run's later snapshots refer to
    the same commit whatever the run commits meanwhile."""
    with _heads_lock:
        if root in _heads:
            return _heads[root]
    found = _look(root, False)[0]
    with _heads_lock:
        _heads[root] = found
    return found


class Clean(Struct):
    """The tracked files git vouches for (_clean): path -> blob id; of those, the ones
    whose bytes are the blob's only if the file on disk has the blob's size (`sized`)."""

    files: dict[bytes, str]
    sized: dict[bytes, int]


NOT_CLEAN = Clean({}, {})


def head_and_clean(root: bytes) -> tuple[Head | None, Clean]:
    """head_of, and the tracked files git vouches for now (_clean), git's commands run
    side by side (a fresh scanner's first scan waits for them)."""
    with _heads_lock:
        known = _heads.get(root, False)
    if known is None:
        return None, NOT_CLEAN
    head, clean = _look(root, True, known if isinstance(known, Head) else None)
    with _heads_lock:
        _heads.setdefault(root, head)
        head = _heads[root]
    return head, clean if head is not None else NOT_CLEAN


def _run(root: bytes, *args: str, stdin: Any = subprocess.DEVNULL) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        ["git", *_SAFE, *args],
        cwd=root,
        env={**os.environ, **_ENV},
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        stdin=stdin,
    )


def _out(proc: subprocess.Popen[bytes], check: bool = True) -> bytes:
    out = proc.communicate(timeout=600)[0]
    if check and proc.returncode != 0:
        raise OSError(f"git {proc.args[len(_SAFE) + 1]!r} failed")  # type: ignore[index]
    return out


def _look(root: bytes, clean: bool, head: Head | None = None) -> tuple[Head | None, Clean]:
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if clean:  # (started first: they take longest)
            # -v: a tag per entry, which tells the ones git does not compare (see _clean)
            procs.append(_run(root, "ls-files", "-s", "-v", "-z"))
            unfiltered = _without_filters(root)
            if unfiltered is not None:
                procs.append(
                    _run(root, *unfiltered, "diff-files", "--name-only", "-z", "--relative")
                )
            procs.append(_run(root, "config", "-z", "--get-regexp", r"^core\.(autocrlf|eol)$"))
            names = _run(root, "ls-files", "-z")
            procs.append(names)
            assert names.stdout is not None
            # --all: only the attributes a path has (asking for CONVERTING by name printed
            # six "unspecified" lines a file, 14 MB at 50,000 files, three times slower)
            procs.append(_run(root, "check-attr", "-z", "--all", "--stdin", stdin=names.stdout))
            names.stdout.close()  # check-attr's now: a failed one ends ls-files too
        if head is None:
            head = _head(root)
        if head is None or not clean or unfiltered is None:
            return head, NOT_CLEAN
        listed, dirty = _out(procs[0]), _out(procs[1])
        config = dict(
            (key.lower(), value.strip().lower())
            for key, _, value in (
                item.partition(b"\n") for item in _out(procs[2], check=False).split(b"\0") if item
            )
        )  # (the last one given wins, as in git)
        attrs = _out(procs[4])
        if names.wait(timeout=600) != 0:
            raise OSError("git 'ls-files' failed")  # check-attr was told of no file
        converts = _conversions(attrs, config)
        if converts is None:
            return head, NOT_CLEAN  # every text file may be converted: none is vouched for
        vouched = _clean(head, listed, dirty, *converts)
        return head, _sized(root, vouched) if vouched.sized else vouched
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, UnicodeDecodeError):
        return head, NOT_CLEAN
    finally:
        for proc in procs:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if proc.poll() is None:
                    proc.kill()
                proc.wait()


def _without_filters(root: bytes) -> list[str] | None:
    """`-c` options that turn off every filter driver the repository's config names: git
    compares a racily clean entry's bytes through its clean filter, a command of the
    config's choosing (a run may have written it), which is never run here, as no
    fsmonitor is. None: a driver whose name `-c` cannot take (then git is not asked)."""
    out = _git(root, "config", "-z", "--name-only", "--get-regexp", r"^filter\.", check=False)
    names = os.fsdecode(out).split("\0")
    drivers = {name.partition(".")[2].rpartition(".")[0] for name in names} - {""}
    if any("=" in d for d in drivers):
        return None
    options = []
    for d in sorted(drivers):
        options += ["-c", f"filter.{d}.clean=", "-c", f"filter.{d}.process="]
        options += ["-c", f"filter.{d}.required=false"]
    return options


def _head(root: bytes) -> Head | None:
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
        remote_proc = _run(root, "config", "--get", "remote.origin.url")
        # Paths relative to `root`, below it alone (ls-tree's, run there).
        tree = _run(root, "ls-tree", "-r", "-z", commit)
        files = _tree_of(_out(tree))
        remote = _out(remote_proc, check=False).strip()
        return Head(
            Baseline(
                commit,
                top,
                without_credentials(remote.decode("utf-8", "replace")),
                prefix,
                fmt or "sha1",
            ),
            files,
        )
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, UnicodeDecodeError):
        return None


_FALSE = (b"false", b"no", b"off", b"0")
_NO_SAY = (b"unspecified", b"unset")


def _conversions(attrs: bytes, config: dict[bytes, bytes]) -> tuple[set[bytes], set[bytes]] | None:
    """From `git check-attr -z --all` (its CONVERTING attributes) and the `core.autocrlf`/`core.eol` config:
    the paths whose bytes on disk git's checkout makes other than their blob's (`ident`,
    a filter, an encoding, CRLF endings), and the paths git only normalizes when they are
    added (`text`, `text=auto`, `eol=lf`: CRLF to LF), whose bytes are the blob's exactly
    when their size is (every CRLF made LF takes a byte off). None: every text file may
    be converted on checkout (`core.autocrlf = true`)."""
    autocrlf = config.get(b"core.autocrlf", b"false")
    if autocrlf not in _FALSE and autocrlf != b"input":
        return None
    crlf_out = config.get(b"core.eol") == b"crlf"  # text written with CRLF on checkout
    converted: set[bytes] = set()
    normalized: set[bytes] = set()
    fields = attrs.split(b"\0")
    for i in range(0, len(fields) - 2, 3):
        path, attr, value = fields[i], fields[i + 1], fields[i + 2]
        if value in _NO_SAY or attr not in CONVERTING:
            continue
        if (
            attr in (b"text", b"crlf")
            and value in (b"set", b"auto", b"input")
            or (attr == b"eol" and value == b"lf")
        ):
            (converted if crlf_out and attr != b"eol" else normalized).add(path)
        else:  # eol=crlf, ident, filter, working-tree-encoding, a value git may read otherwise
            converted.add(path)
    if autocrlf == b"input":  # CRLF to LF when added, for any file git takes for text
        normalized.add(_EVERY)
    return converted, normalized - converted


_EVERY = b"\0"  # (in `normalized`: every path is; no path holds a NUL)


def _clean(
    head: Head,
    listed: bytes,
    dirty: bytes,
    converted: Collection[bytes] = (),
    normalized: Collection[bytes] = (),
) -> Clean:
    """The tracked files git vouches for, as `git status` does (its index's stat data; a
    racily clean entry's content): path (relative to the workspace) -> blob id, for those
    whose index entry is the commit's blob at that path and that `git diff-files` does not
    report. Their bytes are the commit's: a scan need not read them (while their change
    time says they were not touched since git looked: Scanner.use_git). Not those git
    calls clean whatever their bytes: an entry marked assume-unchanged or skip-worktree
    (`ls-files -v` tags it other than `H`; diff-files skips it), or one whose attributes
    (`converted`) make its bytes on disk other than its blob's (CRLF, a filter...). One
    git normalizes when it is added (`normalized`) is vouched for at its blob's size."""
    files = head.files
    out: dict[bytes, str] = {}
    for record in listed.split(b"\0"):
        meta, _, path = record.partition(b"\t")
        fields = meta.split()
        if len(fields) != 4 or fields[0] != b"H" or fields[3] != b"0":
            continue  # a conflict's stages, a file git does not compare: read as any file
        if fields[1] not in FILE_MODES or path in converted:
            continue  # links, submodules; bytes git converts on checkout
        blob = fields[2].decode()
        if files.get(path) == blob:  # else staged, not committed: its blob may be nowhere else
            out[path] = blob
    for path in dirty.split(b"\0"):
        out.pop(path, None)
    every = _EVERY in normalized
    return Clean(out, {p: -1 for p in out if every or p in normalized})


def _sized(root: bytes, clean: Clean) -> Clean:
    """`clean` with its `sized` files' blob sizes (`cat-file --batch-check`: asked only for
    those, as reading a loose object's header costs a file each); one git cannot size is
    not vouched for."""
    ids = {clean.files[p] for p in clean.sized}
    proc = subprocess.run(
        ["git", *_SAFE, "cat-file", "--batch-check=%(objectname) %(objectsize)"],
        cwd=root,
        env={**os.environ, **_ENV},
        input=b"".join(i.encode() + b"\n" for i in ids),
        capture_output=True,
        timeout=600,
        check=False,
    )
    sizes: dict[str, int] = {}
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].isdigit():
            sizes[parts[0].decode()] = int(parts[1])
    files, sized = dict(clean.files), {}
    for path in clean.sized:
        size = sizes.get(files[path])
        if size is None:
            del files[path]
        else:
            sized[path] = size
    return Clean(files, sized)


class Source:
    """A baseline's repository on this host, opened for reading blobs (`git cat-file`)."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline = baseline
        self.lock = threading.Lock()
        self.repo: str | None = None
        self.ids: frozenset[str] = frozenset()  # the blob ids of the commit's files
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
                    self.ids = frozenset(_tree(repo, b.commit, b.prefix).values())
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

    def read(self, blob_id: str) -> bytes | None:
        """The bytes of the commit's blob `blob_id` (None: the commit has no such file),
        checked against git's hash of them."""
        self.open()
        with self.lock:
            if blob_id not in self.ids:
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
            proc.stdin.write(blob_id.encode() + b"\n")
            proc.stdin.flush()
            header = proc.stdout.readline().split()
            if len(header) != 3 or header[1] != b"blob":
                return None
            data = proc.stdout.read(int(header[2]))
            proc.stdout.read(1)  # the newline after the object
        return data if git_blob_id(data, self.baseline.format) == blob_id else None

    def has(self, blob_id: str) -> bool:
        """The commit has a file of that blob (its bytes are checked when read)."""
        self.open()
        return blob_id in self.ids


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
