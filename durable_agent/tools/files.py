"""File tools: list, read, search (read effects) and write, edit (idempotent writes)."""

from __future__ import annotations

import contextlib
import errno
import fnmatch
import hashlib
import io
import os
import re
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field

from durable_agent.encoding import (
    decode_text,
    encode_content,
    looks_binary,
    surrogate_note,
    text_encoding,
)
from durable_agent.status import EffectClass
from durable_agent.tools import beneath
from durable_agent.tools.base import ToolContext, ToolFailure, ToolResult, WritePlan
from durable_agent.tools.limits import cap_text, describe_binary, read_capped
from durable_agent.tools.sandbox import escapes, relative, resolve
from durable_agent.tools.tree import walk

SKIP_DIRS = {
    ".git",
    "node_modules",
    "__pycache__",
    ".venv",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
}
MAX_LIST_ENTRIES = 1000
MAX_READ_BYTES = 64 << 20  # what a file tool reads into memory at most (the rest: a command)
MAX_MATCHES = 200
MAX_SEARCH_FILE_BYTES = 2_000_000


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha(path: Path, shown: str | None = None, root: str | None = None) -> str | None:
    """The hash of the file's bytes; None when it does not exist, "directory" for a folder.

    `shown` is the workspace-relative path for messages (ToolFailure when it cannot be read);
    `root`, the workspace's real path, which `path` is opened beneath (tools/beneath.py).
    """
    shown = shown or path.as_posix()
    try:
        f, _ = _open_regular(path, shown, root)
        with f:
            return hashlib.file_digest(f, "sha256").hexdigest()  # in chunks: any size
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return "directory"
    except NotADirectoryError:
        raise ToolFailure(_not_a_directory(path, shown)) from None
    except PermissionError:
        raise ToolFailure(f"{shown}: permission denied") from None


def regular_bytes(path: Path, shown: str, root: str | None = None) -> bytes:
    """The bytes of a regular file of at most MAX_READ_BYTES (or OSError, or ToolFailure):
    the harness holds what it reads in memory, and a command can make a file of any size
    (`truncate -s 100G`)."""
    f, size = _open_regular(path, shown, root)
    with f:
        data = read_capped(f, size, MAX_READ_BYTES) if size <= MAX_READ_BYTES else b""
    if size > MAX_READ_BYTES or len(data) > MAX_READ_BYTES:
        raise ToolFailure(
            f"{shown} is {max(size, len(data)):,} bytes, more than the {MAX_READ_BYTES >> 20} MiB a "
            "file tool reads; read parts of it with a command (head, tail, sed -n)"
        )
    return data


def _open_regular(path: Path, shown: str, root: str | None = None) -> tuple[io.BufferedReader, int]:
    """A regular file, open for reading, and its size (or OSError). A FIFO, socket or device
    is refused, never read: opening a FIFO that has no writer would block the harness for
    good (no signal gets it out of the open), and a device can be endless. With `root` (the
    workspace's real path) it is opened beneath the workspace's fd, no link followed: a
    folder swapped for a link since `resolve` looked is refused, not read through."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC  # a FIFO opens at once
    try:
        if root is None:
            fd = os.open(path, flags)
        else:
            with beneath.root(root) as root_fd:
                fd = beneath.open_at(root_fd, beneath.relative_to(root, str(path)), flags)
    except beneath.Escaped:
        raise ToolFailure(outside(shown)) from None
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a socket
            raise ToolFailure(f"{shown} is not a regular file (a socket)") from None
        raise
    f = os.fdopen(fd, "rb")
    st = os.fstat(fd)
    mode = st.st_mode
    if not stat.S_ISREG(mode):
        f.close()
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device or other special file"
        raise ToolFailure(f"{shown} is not a regular file ({kind})")
    return f, st.st_size


def outside(shown: str) -> str:
    """The refusal of a path that leads out of the workspace (sandbox.resolve says the same)."""
    return f"path {shown!r} is outside the workspace; use a path relative to it"


def _not_a_directory(path: Path, shown: str) -> str:
    """`README.md/x` when README.md is a file: name the part that is in the way."""
    blocker = next((p for p in path.parents if p.exists()), None)  # the nearest that exists
    if blocker is not None and not blocker.is_dir():
        return f"{shown}: {blocker.name} is a file, not a directory"
    return f"{shown}: a parent of it is not a directory"


def planned_file_sha(plan: WritePlan, ctx: ToolContext) -> str | None:
    """The hash the planned file has now: what resume compares with the recorded before/after."""
    return file_sha(
        resolve(ctx.workspace, plan.path, for_write=True, store=ctx.store),
        plan.path,
        os.path.realpath(ctx.workspace),
    )


def atomic_write(
    path: Path,
    data: bytes,
    before_rename: Callable[[], None] | None = None,
    *,
    root: str,
    shown: str | None = None,
) -> None:
    """Temp file in the same folder, fsync, rename: a crash leaves the old or the new file.
    Every step is relative to the folder's fd, opened beneath `root` (the workspace's real
    path) with no link followed: the temp file, the mode read, the rename.

    `before_rename` (ToolContext.before_rename) may raise to stop it, nothing written: a
    process frozen after its intent (SIGSTOP, a paused VM) for longer than its lease may
    wake when another has taken the run over and finished it, and its late write would
    overwrite the newer file."""
    try:
        with (
            beneath.root(root) as root_fd,
            beneath.parent_of(root_fd, beneath.relative_to(root, str(path)), create=True) as (
                dir_fd,
                name,
            ),
        ):
            _write_in(dir_fd, name, data, before_rename)
    except beneath.Escaped:
        raise ToolFailure(outside(shown or path.as_posix())) from None


def _write_in(
    dir_fd: int, name: str, data: bytes, before_rename: Callable[[], None] | None
) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        # The permission bits, not setuid, setgid or sticky: new bytes under an old setuid
        # bit would run as its owner (the kernel clears the bit on a write for this reason,
        # and here the file is replaced, not written).
        mode = stat.S_IMODE(st.st_mode) & 0o777 if stat.S_ISREG(st.st_mode) else None
    except FileNotFoundError:
        mode = None
    prefix = f".{name}.da-"
    # A write killed before its rename leaves its temp file; resume re-applies the write
    # (the file still has its "before" hash), and this is where the leftover goes.
    with os.scandir(dir_fd) as entries:
        stale = [e.name for e in entries if e.name.startswith(prefix) and e.name.endswith(".tmp")]
    for leftover in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(leftover, dir_fd=dir_fd)
    tmp = beneath.temp_name(name)
    fd = beneath.create_exclusive(dir_fd, tmp, 0o600)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            # Created 0600; a new file gets what the user's umask gives (0644 usually).
            os.fchmod(f.fileno(), mode if mode is not None else 0o666 & ~_umask())
            os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.rename(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp, dir_fd=dir_fd)
        raise


def _umask() -> int:
    """The process umask, read without changing it (os.umask can only be read by setting it,
    which races with other threads creating files)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o022


def read_bytes(path: Path, display: str, root: str | None = None) -> bytes:
    """The file's bytes, refusing binary files with a description of them."""
    try:
        data = regular_bytes(path, display, root)
    except FileNotFoundError:
        raise ToolFailure(f"file not found: {display}") from None
    except IsADirectoryError:
        raise ToolFailure(f"{display} is a directory; use list_files") from None
    except NotADirectoryError:
        raise ToolFailure(_not_a_directory(path, display)) from None
    except PermissionError:
        raise ToolFailure(f"{display}: permission denied") from None
    if looks_binary(data[:8192]):
        raise ToolFailure(describe_binary(display, len(data), data[:16]))
    return data


def read_text(path: Path, display: str, root: str | None = None) -> tuple[str, str | None]:
    """For showing: the text and a note when it was not UTF-8 (durable_agent/encoding.py: Latin-1
    or the bad bytes as \\xHH)."""
    return decode_text(read_bytes(path, display, root))


# -- list_files ------------------------------------------------------------------------------
class ListFilesArgs(BaseModel):
    path: str = Field(".", description="Directory relative to the workspace.")
    max_depth: int = Field(2, ge=1, le=10, description="How many levels to descend.")


class ListFiles:
    name: ClassVar[str] = "list_files"
    description: ClassVar[str] = "List files and directories (directories end with /)."
    args_model: ClassVar[type[BaseModel]] = ListFilesArgs
    effect: ClassVar[EffectClass] = EffectClass.READ

    def run(self, args: ListFilesArgs, ctx: ToolContext) -> ToolResult:
        root = resolve(ctx.workspace, args.path)
        if not root.is_dir():
            raise ToolFailure(f"not a directory: {args.path}")
        lines: list[str] = []
        base_depth = len(root.parts)
        real_root = os.path.realpath(ctx.workspace)
        for dirpath, dirnames, filenames, _links in walk(str(root), beneath=real_root):
            here = Path(dirpath)
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            depth = len(here.parts) - base_depth
            if depth >= args.max_depth:
                dirnames[:] = []
            for d in dirnames:
                lines.append(relative(ctx.workspace, here / d) + "/")
            for f in sorted(filenames):
                lines.append(relative(ctx.workspace, here / f))
            if len(lines) > MAX_LIST_ENTRIES:
                break
        lines.sort()
        extra = len(lines) - MAX_LIST_ENTRIES
        shown = lines[:MAX_LIST_ENTRIES]
        if extra > 0:
            shown.append(f"[... {extra} more entries not shown ...]")
        return ToolResult(
            output="\n".join(shown) or "(empty directory)", data={"entries": len(lines)}
        )


# -- read_file -------------------------------------------------------------------------------
class ReadFileArgs(BaseModel):
    path: str = Field(description="File relative to the workspace.")
    offset: int = Field(0, ge=0, description="First line to return (0-based).")
    limit: int | None = Field(
        None, ge=1, description="Number of lines to return (all when omitted)."
    )


class ReadFile:
    name: ClassVar[str] = "read_file"
    description: ClassVar[str] = "Read a text file, optionally a range of lines."
    args_model: ClassVar[type[BaseModel]] = ReadFileArgs
    effect: ClassVar[EffectClass] = EffectClass.READ

    def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        path = resolve(ctx.workspace, args.path)
        text, decoded = read_text(path, args.path, os.path.realpath(ctx.workspace))
        lines = text.splitlines(keepends=True)
        end = len(lines) if args.limit is None else args.offset + args.limit
        chunk = "".join(lines[args.offset : end])
        note = f"\n[{decoded}]" if decoded else ""
        if args.offset or end < len(lines):
            note += f"\n[lines {args.offset}-{min(end, len(lines))} of {len(lines)}]"
        return ToolResult(
            output=cap_text(chunk, ctx.output_cap) + note,
            data={"lines": len(lines), "bytes": len(text)},
        )


# -- search_text -----------------------------------------------------------------------------
class SearchTextArgs(BaseModel):
    pattern: str = Field(description="Regular expression (Python syntax).")
    path: str = Field(".", description="File or directory to search in.")
    glob: str | None = Field(None, description="Only files whose name or path matches, e.g. *.py")


class SearchText:
    name: ClassVar[str] = "search_text"
    description: ClassVar[str] = "Search files for a regular expression; prints path:line: text."
    args_model: ClassVar[type[BaseModel]] = SearchTextArgs
    effect: ClassVar[EffectClass] = EffectClass.READ

    def run(self, args: SearchTextArgs, ctx: ToolContext) -> ToolResult:
        try:
            regex = re.compile(args.pattern)
        except re.error as exc:
            raise ToolFailure(f"invalid regular expression: {exc}") from None
        root = resolve(ctx.workspace, args.path)
        real_root = os.path.realpath(ctx.workspace)
        files = [root] if root.is_file() else self._files(root, real_root)
        matches: list[str] = []
        total = 0
        too_big: list[str] = []
        for file in files:
            if file is not root and escapes(ctx.workspace, file):
                continue  # a symlink to outside the workspace: its content is not ours to show
            rel = relative(ctx.workspace, file)
            if args.glob and not (
                fnmatch.fnmatch(file.name, args.glob) or fnmatch.fnmatch(rel, args.glob)
            ):
                continue
            try:
                # A link inside the workspace is read at what it names, beneath the
                # workspace's fd like every other path (a link appearing since is refused).
                f, size = _open_regular(Path(os.path.realpath(file)), rel, real_root)
                with f:
                    if size > MAX_SEARCH_FILE_BYTES:
                        too_big.append(rel)
                        continue
                    data = read_capped(f, size, MAX_SEARCH_FILE_BYTES)
                if len(data) > MAX_SEARCH_FILE_BYTES:  # grown since its fstat
                    too_big.append(rel)
                    continue
            except (OSError, ToolFailure):  # unreadable, a FIFO, a socket: not searched
                continue
            if looks_binary(data[:8192]):
                continue
            for n, line in enumerate(decode_text(data)[0].splitlines(), 1):
                if regex.search(line):
                    total += 1
                    if len(matches) < MAX_MATCHES:
                        matches.append(f"{rel}:{n}: {line[:300]}")
        if total > len(matches):
            matches.append(f"[... {total - len(matches)} more matches not shown ...]")
        out = "\n".join(matches) if matches else "no matches"
        if too_big:
            # "no matches" alone would claim those files were searched.
            names = ", ".join(too_big[:5]) + (", ..." if len(too_big) > 5 else "")
            out += (
                f"\n[{len(too_big)} file(s) not searched: larger than the "
                f"{MAX_SEARCH_FILE_BYTES // 1_000_000} MB search limit ({names}); "
                "read them in parts with read_file]"
            )
        found: dict[str, Any] = {"matches": total}
        if too_big:
            found["skipped_too_big"] = len(too_big)
        return ToolResult(output=cap_text(out, ctx.output_cap), data=found)

    @staticmethod
    def _files(root: Path, real_root: str) -> list[Path]:
        found: list[Path] = []
        for dirpath, dirnames, filenames, _links in walk(str(root), beneath=real_root):
            dirnames[:] = sorted(d for d in dirnames if d not in SKIP_DIRS)
            found.extend(Path(dirpath) / f for f in sorted(filenames))
        return found


# -- write_file ------------------------------------------------------------------------------
class WriteFileArgs(BaseModel):
    path: str = Field(description="File relative to the workspace; folders are created.")
    content: str = Field(description="The whole new content of the file.")


class WriteFile:
    name: ClassVar[str] = "write_file"
    description: ClassVar[str] = "Create or overwrite a file with the given content."
    args_model: ClassVar[type[BaseModel]] = WriteFileArgs
    effect: ClassVar[EffectClass] = EffectClass.WRITE

    def plan(self, args: WriteFileArgs, ctx: ToolContext) -> WritePlan:
        path = resolve(ctx.workspace, args.path, for_write=True, store=ctx.store)
        shown = relative(ctx.workspace, path)
        return WritePlan(
            path=shown,
            before_sha=file_sha(path, shown, os.path.realpath(ctx.workspace)),
            after_sha=sha256_bytes(encode_content(args.content)[0]),
        )

    def current_sha(self, plan: WritePlan, ctx: ToolContext) -> str | None:
        return planned_file_sha(plan, ctx)

    def run(self, args: WriteFileArgs, ctx: ToolContext) -> ToolResult:
        path = resolve(ctx.workspace, args.path, for_write=True, store=ctx.store)
        data, replaced = encode_content(args.content)
        existed = path.exists()
        atomic_write(
            path, data, ctx.before_rename, root=os.path.realpath(ctx.workspace), shown=args.path
        )
        verb = "overwrote" if existed else "created"
        return ToolResult(
            output=f"{verb} {args.path} ({len(data)} bytes){surrogate_note(replaced)}",
            data={"bytes": len(data)},
        )


# -- edit_file -------------------------------------------------------------------------------
class EditFileArgs(BaseModel):
    path: str = Field(description="File relative to the workspace.")
    old_string: str = Field(description="Exact text to replace; must occur exactly once.")
    new_string: str = Field(description="Replacement text.")


class EditFile:
    name: ClassVar[str] = "edit_file"
    description: ClassVar[str] = (
        "Replace one exact occurrence of old_string with new_string in a file."
    )
    args_model: ClassVar[type[BaseModel]] = EditFileArgs
    effect: ClassVar[EffectClass] = EffectClass.WRITE

    def _edited(self, args: EditFileArgs, ctx: ToolContext) -> tuple[Path, bytes, bytes]:
        """The file's bytes as they are and as they will be. Decoded strictly: a lossy decode
        would write U+FFFD over bytes the edit never touched, and hash text the file is not.
        Latin-1 text (as read_file showed it) is edited as Latin-1: every byte round-trips."""
        path = resolve(ctx.workspace, args.path, for_write=True, store=ctx.store)
        before = read_bytes(path, args.path, os.path.realpath(ctx.workspace))
        encoding = text_encoding(before)
        if encoding == "mixed":
            raise ToolFailure(f"{args.path} is not UTF-8 text; use write_file to replace it")
        text = before.decode(encoding)
        if not args.old_string:
            raise ToolFailure("old_string is empty; use write_file to create a file")
        count = text.count(args.old_string)
        if count != 1:
            where = (
                "not found" if count == 0 else f"found {count} times; add context to make it unique"
            )
            raise ToolFailure(f"old_string {where} in {args.path}")
        new = text.replace(args.old_string, args.new_string, 1)
        if encoding == "utf-8":
            return path, before, encode_content(new)[0]
        try:
            return path, before, new.encode("latin-1")
        except UnicodeEncodeError:
            raise ToolFailure(
                f"{args.path} is Latin-1 text and new_string has characters Latin-1 cannot "
                "hold; use write_file to rewrite the file as UTF-8"
            ) from None

    def plan(self, args: EditFileArgs, ctx: ToolContext) -> WritePlan:
        path, before, after = self._edited(args, ctx)
        return WritePlan(
            path=relative(ctx.workspace, path),
            before_sha=sha256_bytes(before),
            after_sha=sha256_bytes(after),
        )

    def current_sha(self, plan: WritePlan, ctx: ToolContext) -> str | None:
        return planned_file_sha(plan, ctx)

    def run(self, args: EditFileArgs, ctx: ToolContext) -> ToolResult:
        path, _before, after = self._edited(args, ctx)
        atomic_write(
            path, after, ctx.before_rename, root=os.path.realpath(ctx.workspace), shown=args.path
        )
        delta = args.new_string.count("\n") - args.old_string.count("\n")
        note = surrogate_note(encode_content(args.new_string)[1])
        return ToolResult(
            output=f"edited {args.path} ({delta:+d} lines){note}", data={"bytes": len(after)}
        )
