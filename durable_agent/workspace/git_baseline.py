"""The `snapshot_baseline = "git"` setting: files a git commit already holds are not stored.

In a git checkout, a snapshot records its repository's HEAD commit (`Baseline`: the
commit, the repository's path, its `origin` remote without credentials, the workspace's
folder in it) with the tree (`workspace_trees.git`). A file whose bytes are the blob its
path has at that commit is named in the manifest by `git:` and that blob id (GIT_REF), not
by a sha256, and is not written to `workspace_blobs`: the commit holds it. The scanner
(scan.py) takes those ids on git's word, without reading them, for the tracked files whose
lstat is what git's index recorded for them (as `git status` does: git_index.index_files,
head_and_seeds), and by git's blob id of the bytes for a file it reads. Everything else (modified, untracked and
staged-but-uncommitted files, ignored ones the snapshot keeps) is stored as with the
default ("store").

Rebuilding (`restore`, `fork`, resume into an empty folder) reads the `git:` files by id
(`cat-file --batch`) from the repository at its recorded path when it holds the commit,
else a bare clone of the recorded remote in the user's cache
(`$XDG_CACHE_HOME/durable-agent/git/`), and checks git's hash of each. Where neither has
the commit, it says so in one line (GitBaselineUnreachable, exit 2) before anything is
written. `.git` is left out of snapshots as always: a rebuilt folder holds the files, not a
repository.

git is run only with commands that read (rev-parse, config, check-attr, diff-index,
ls-tree, cat-file), with fsmonitor and optional locks off: the work tree and the index
are never written, and no fsmonitor, hook or filter of the workspace's runs (none of these
commands reads a work tree file's bytes).
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
import time
import urllib.parse
from collections import OrderedDict
from collections.abc import Collection, Iterable
from pathlib import Path
from typing import Any

from msgspec import Struct

from durable_agent.errors import WorkspaceUnreachable
from durable_agent.workspace.git_index import (
    NO_SEEDS,
    IndexFiles,
    Seeds,
    Vouched,
    find_index,
    index_files,
    sha256_repository,
)
from durable_agent.workspace.manifest import GIT_REF

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


def blob_id_of(ref: str) -> str | None:
    """The git blob id a manifest's content id names (None: a sha256, the store holds it)."""
    return ref[len(GIT_REF) :] if ref.startswith(GIT_REF) else None


def ref_format(ref: str) -> str:
    """The hash a `git:` content id was made with (its length tells)."""
    return "sha256" if len(ref) == len(GIT_REF) + 64 else "sha1"


# A regular file's record of `git ls-tree -r -z`, matched where a record starts: never
# within a path (one may hold that text after its tab), which runs to the record's NUL.
_FILE_RECORD = re.compile(
    rb"(?:^|(?<=\0))(?:%s) blob ([0-9a-f]+)\t([^\0]*)\0" % b"|".join(FILE_MODES)
)


def _tree_of(out: bytes) -> dict[bytes, str]:
    """`git ls-tree -r -z`'s regular files: path -> blob id (links and submodules are
    recorded by the manifest as they are, not from here). One expression over the whole
    listing: a split and a parse a record took twice as long."""
    return {path: blob.decode() for blob, path in _FILE_RECORD.findall(out)}


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
        if root in _heads:  # (every later snapshot of a run asks: no git command then)
            return _heads[root]
    return head_and_seeds(root, seeds=False)[0]


def head_and_seeds(root: bytes, *, seeds: bool = True) -> tuple[Head | None, Seeds]:
    """head_of, and the seeds of a fresh scan (git_index.Seeds): path -> the stat data git's
    index recorded for a tracked file whose index entry is the commit's blob at its path and
    whose bytes on disk git does not convert (its attributes, `core.autocrlf`...), with
    those files' lstat taken while git's commands run. A file whose lstat is that is the
    blob, as `git status` holds without reading it (Scanner.use_git)."""
    with _heads_lock:
        known = _heads.get(root, False)
    if known is None:
        return None, NO_SEEDS
    found = _look(root, known if isinstance(known, Head) else None, seeds)
    with _heads_lock:
        _heads.setdefault(root, found[0])
        head = _heads[root]
    return (head, found[1]) if head is not None else (None, NO_SEEDS)


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


_CONFIG = r"^(core\.(autocrlf|eol)|remote\.origin\.url)$"


def _look(root: bytes, known: Head | None, seeds: bool) -> tuple[Head | None, Seeds]:
    """(the Head: `known`, else the checkout's now; the seeds, when asked for). The files at
    HEAD are read from git's index: as they are where its cache-tree says the index is
    HEAD's tree, else with what `git diff-index --cached` says differs from the commit (the
    tree is not listed: 50,000 paths cost git and Python 100 ms); from `git ls-tree` where
    the index is not one index_files reads.

    The index is the one found as git finds it (git_index.find_index), read while `git
    rev-parse` runs; where rev-parse names another (GIT_INDEX_FILE, GIT_DIR, core.worktree
    in the environment or the config), git's word stands and no file is taken unread."""
    procs: list[subprocess.Popen[bytes]] = []
    indexed: IndexFiles | None = None
    try:
        asked = _run(
            root,
            "rev-parse",
            "--show-toplevel",
            "--show-prefix",
            "--show-object-format",
            "--git-path",
            "index",
            "HEAD^{commit}",
            "HEAD^{tree}",
        )
        procs.append(asked)
        config = _run(root, "config", "-z", "--get-regexp", _CONFIG)
        procs.append(config)
        feed = -1
        if seeds:
            # --all: only the attributes a path has (asking for CONVERTING by name printed
            # six "unspecified" lines a file, 14 MB at 50,000 files, three times slower).
            # Told the paths by index_files as soon as it has read them (`git ls-files`
            # cost a process and 8 ms of a core more).
            told, feed = os.pipe()
            try:
                attrs = _run(root, "check-attr", "-z", "--all", "--stdin", stdin=told)
            except BaseException:
                os.close(feed)
                raise
            finally:
                os.close(told)
            procs.append(attrs)
        taken = time.time_ns()  # (the lstat calls' start: racy from then on)
        found = find_index(root)
        if found is None:
            if feed >= 0:
                os.close(feed)
        else:
            index_path, found_prefix = found
            sha256 = sha256_repository(os.path.dirname(index_path))
            indexed = index_files(
                index_path,
                found_prefix,
                32 if sha256 else 20,
                root=root if seeds else None,
                feed=feed,  # (closed by it)
            )
        top, prefix, fmt, index, commit, tree = _out(asked).decode().split("\n")[:6]
        prefix, fmt = prefix.rstrip("/"), fmt or "sha1"
        if found is not None and (
            os.fsencode(prefix) != found_prefix
            or (fmt == "sha256") != sha256
            or os.path.realpath(os.path.join(root, os.fsencode(index)))
            != os.path.realpath(index_path)
        ):
            indexed = None  # not the index git reads (its lstat threads end with it)
        staged: set[bytes] = set()
        if indexed is None:  # the tree as git lists it; nothing taken unread
            files = _tree_of(_git(root, "ls-tree", "-r", "-z", commit))
        elif indexed.tree == tree:  # the index is HEAD's tree: nothing staged
            files = indexed.files
        else:
            raw = _git(
                root, "diff-index", "--cached", "--raw", "-z", "--no-renames", "--relative", commit
            )
            files, staged = _at_commit(indexed.files, raw)
        settings = dict(
            (key.lower(), value.strip())
            for key, _, value in (
                item.partition(b"\n") for item in _out(config, check=False).split(b"\0") if item
            )
        )  # (the last one given wins, as in git)
        head = known or Head(
            Baseline(
                commit,
                top,
                without_credentials(
                    settings.get(b"remote.origin.url", b"").decode("utf-8", "replace")
                ),
                prefix,
                fmt,
            ),
            files,
        )
        if not seeds or indexed is None:
            return head, NO_SEEDS
        told_all = _out(attrs)
        if not indexed.vouched.fed():
            raise OSError("git 'check-attr' was not told every path")
        converts = _conversions(
            told_all, {k: v.lower() for k, v in settings.items() if k.startswith(b"core.")}
        )
        if converts is None:
            return head, NO_SEEDS  # every text file may be converted: none is taken unread
        return head, Seeds(_seeds(root, head, indexed, staged, *converts), taken)
    except (OSError, subprocess.SubprocessError, ValueError, IndexError, UnicodeDecodeError):
        return known, NO_SEEDS
    finally:
        for proc in procs:
            with contextlib.suppress(OSError, subprocess.SubprocessError):
                if proc.poll() is None:
                    proc.kill()
                proc.wait()


def _at_commit(indexed: dict[bytes, str], raw: bytes) -> tuple[dict[bytes, str], set[bytes]]:
    """The commit's regular files (path -> blob id), from the index's and what `git
    diff-index --cached --raw -z` (`raw`) says differs from the commit; and those paths."""
    fields = raw.split(b"\0")
    if len(fields) < 2:
        return indexed, set()
    files = dict(indexed)
    staged = set()
    for i in range(0, len(fields) - 1, 2):
        meta, path = fields[i], fields[i + 1]
        parts = meta.lstrip(b":").split()
        if len(parts) != 5:
            raise ValueError(f"git diff-index said {meta[:80]!r}")
        staged.add(path)
        if parts[0] in FILE_MODES:  # what the commit has there
            files[path] = parts[2].decode()
        else:
            files.pop(path, None)
    return files, staged


def _seeds(
    root: bytes,
    head: Head,
    indexed: IndexFiles,
    staged: set[bytes],
    converted: Collection[bytes],
    normalized: Collection[bytes],
) -> Vouched:
    """The files the index's stat data vouches for (IndexFiles.vouched) whose bytes are the
    blob `head` names at their path: the index's blob is the commit's (not `staged`, nor of
    another commit than `head`'s), and git does not convert their bytes on checkout
    (`converted`). One git normalizes when it is added (`normalized`: CRLF to LF) only if
    its blob has the size the index recorded for it."""
    drop = set(staged).union(converted)
    if head.files is not indexed.files:  # (corrected by diff-index, or a Head found before)
        at = head.files
        drop.update(p for p, blob in indexed.files.items() if at.get(p) != blob)
    if normalized:
        every = _EVERY in normalized
        recorded = indexed.vouched.recorded_sizes(
            [p for p in indexed.files if (every or p in normalized) and p not in drop]
        )
        sizes = _blob_sizes(root, {indexed.files[p] for p in recorded})
        drop.update(p for p, size in recorded.items() if sizes.get(indexed.files[p]) != size)
    indexed.vouched.exclude(drop)
    return indexed.vouched


def _blob_sizes(root: bytes, ids: set[str]) -> dict[str, int]:
    """The sizes of blobs (`cat-file --batch-check`: asked only for those that need it, as
    reading a loose object's header costs a file each)."""
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
    return sizes


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


class Source:
    """A baseline's repository on this host, opened for reading blobs (`git cat-file`)."""

    def __init__(self, baseline: Baseline) -> None:
        self.baseline = baseline
        self.lock = threading.Lock()
        self.repo: str | None = None
        self.ids: frozenset[str] = frozenset()  # the blob ids of the commit's files
        self._proc: subprocess.Popen[bytes] | None = None
        self._files: dict[bytes, str] = {}

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
                    spec = f"{b.commit}:{b.prefix}" if b.prefix else b.commit
                    # --full-tree: the whole of that tree, whatever folder git takes for the
                    # current one (else cut to it: `GIT_DIR` in the environment when the
                    # snapshot was taken made the workspace's folder the work tree's top).
                    files = _tree_of(_git(repo, "ls-tree", "--full-tree", "-r", "-z", spec))
                except (OSError, subprocess.SubprocessError):
                    continue
                self._files = files
                self.ids = frozenset(files.values())
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

    def close(self) -> None:
        """Its `cat-file` process ended (a later read starts another)."""
        with self.lock:
            proc, self._proc = self._proc, None
        if proc is not None:
            _ended(proc)
            with contextlib.suppress(ValueError):
                _open_procs.remove(proc)

    def files(self) -> dict[bytes, str]:
        """The commit's regular files below the workspace's folder: path (relative to it) ->
        blob id, as `git ls-tree -r` lists them (the repository found): the base of a tree
        stored as the differences from the commit (manifest.encode_head)."""
        self.open()
        return self._files


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "durable-agent" / "git"


# The repositories found, the most recently asked last. A worker goes through many: each
# holds its commit's listing (about 10 MB at 50,000 files) and a `cat-file` process, let go
# of past SOURCES_KEPT (a store that still holds one starts its process again if it reads).
SOURCES_KEPT = 16
_sources: OrderedDict[Baseline, Source] = OrderedDict()
_sources_lock = threading.Lock()
_open_procs: list[subprocess.Popen[bytes]] = []


def source(baseline: Baseline) -> Source:
    with _sources_lock:
        found = _sources.get(baseline)
        if found is None:
            found = _sources[baseline] = Source(baseline)
        _sources.move_to_end(baseline)
        dropped = [_sources.popitem(last=False)[1] for _ in range(len(_sources) - SOURCES_KEPT)]
    for old in dropped:
        old.close()
    return found


def _ended(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
        if proc.stdin is not None:
            proc.stdin.close()
        proc.wait(timeout=5)


@atexit.register
def _close() -> None:
    for proc in _open_procs:
        _ended(proc)
