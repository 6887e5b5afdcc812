"""File tools: confinement, atomic idempotent writes, caps, binary files."""

from __future__ import annotations

import json
import os
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from durable_agent.tools import build_tools
from durable_agent.tools.base import ToolContext, ToolFailure, ToolResult, tool_schema
from durable_agent.tools.files import EditFile, WriteFile, file_sha


def call(ws: Path, name: str, cap: int = 20_000, **args: object) -> ToolResult:
    tool = build_tools("deny")[name]
    ctx = ToolContext(workspace=ws, run_id="r", call_id="c", output_cap=cap)
    try:
        return tool.run(tool.args_model.model_validate(args), ctx)
    except ToolFailure as exc:
        return ToolResult(error=str(exc))


@pytest.mark.parametrize(
    "path", ["../outside.txt", "/etc/passwd", "sub/../../x", "link/secret.txt", "link2"]
)
def test_paths_that_escape_are_refused(workspace: Path, tmp_path: Path, path: str) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s3cret")
    (workspace / "sub").mkdir()
    (workspace / "link").symlink_to(outside)
    (workspace / "link2").symlink_to(outside / "secret.txt")
    for name, extra in (("read_file", {}), ("write_file", {"content": "x"}), ("list_files", {})):
        result = call(workspace, name, path=path, **extra)
        assert result.error and "outside the workspace" in result.error, (name, result)
    assert (outside / "secret.txt").read_text() == "s3cret"


def test_symlink_inside_the_workspace_is_fine(workspace: Path) -> None:
    (workspace / "real.txt").write_text("ok\n")
    (workspace / "alias.txt").symlink_to(workspace / "real.txt")
    assert call(workspace, "read_file", path="alias.txt").output.startswith("ok")


def test_writes_refuse_git_internals_and_directories(workspace: Path) -> None:
    (workspace / ".git").mkdir()
    assert ".git" in (call(workspace, "write_file", path=".git/config", content="x").error or "")
    assert "directory" in (call(workspace, "write_file", path=".", content="x").error or "")


@pytest.mark.parametrize("path", ["newdir/", "sub/newdir/", "file.txt/", "file.txt/."])
def test_a_path_that_names_a_folder_is_never_written_as_a_file(workspace: Path, path: str) -> None:
    """`newdir/` names a folder (open(2) says EISDIR): no file `newdir` is made, nor is an
    existing file `file.txt` overwritten by a write to `file.txt/`."""
    (workspace / "file.txt").write_text("kept\n")
    result = call(workspace, "write_file", path=path, content="x")
    assert result.error and "directory" in result.error, result
    assert not (workspace / "newdir").exists() and not (workspace / "sub").exists()
    assert (workspace / "file.txt").read_text() == "kept\n"
    edit = call(workspace, "edit_file", path="file.txt/", old_string="kept", new_string="gone")
    assert edit.error, edit
    assert (workspace / "file.txt").read_text() == "kept\n"


def test_write_is_atomic_keeps_mode_and_leaves_no_temp_files(workspace: Path) -> None:
    target = workspace / "bin" / "run.sh"
    assert call(workspace, "write_file", path="bin/run.sh", content="#!/bin/sh\n").error is None
    os.chmod(target, 0o755)
    (target.parent / ".run.sh.da-leftover.tmp").write_text("from a killed write")
    assert (
        call(workspace, "write_file", path="bin/run.sh", content="#!/bin/sh\necho hi\n").error
        is None
    )
    assert target.read_text() == "#!/bin/sh\necho hi\n"
    assert target.stat().st_mode & 0o777 == 0o755
    assert sorted(p.name for p in target.parent.iterdir()) == ["run.sh"]


@pytest.mark.parametrize("tool", ["write_file", "edit_file"])
def test_a_rewritten_file_loses_its_setuid_and_setgid_bits(workspace: Path, tool: str) -> None:
    # Replaced, not written: the kernel's clearing of these bits on a write does not apply,
    # and new bytes under an old setuid bit would run as the file's owner.
    target = workspace / "tool"
    target.write_text("#!/bin/sh\necho old\n")
    os.chmod(target, 0o6755)
    assert target.stat().st_mode & 0o7777 == 0o6755
    args = {"path": "tool", "content": "#!/bin/sh\necho new\n"}
    if tool == "edit_file":
        args = {"path": "tool", "old_string": "old", "new_string": "new"}
    assert call(workspace, tool, **args).error is None
    assert target.read_text() == "#!/bin/sh\necho new\n"
    assert target.stat().st_mode & 0o7777 == 0o755  # the permission bits kept, no more


def test_write_plan_records_before_and_after_hashes(workspace: Path) -> None:
    (workspace / "a.txt").write_text("old")
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    tool = WriteFile()
    args = tool.args_model.model_validate({"path": "a.txt", "content": "new"})
    plan = tool.plan(args, ctx)
    assert plan.before_sha == file_sha(workspace / "a.txt")
    tool.run(args, ctx)
    assert tool.current_sha(plan, ctx) == plan.after_sha == file_sha(workspace / "a.txt")
    fresh = tool.plan(tool.args_model.model_validate({"path": "b.txt", "content": "x"}), ctx)
    assert fresh.before_sha is None


def test_edit_must_match_exactly_once(workspace: Path) -> None:
    (workspace / "a.py").write_text("x = 1\ny = 1\n")
    assert "found 2 times" in (
        call(workspace, "edit_file", path="a.py", old_string="= 1", new_string="= 2").error or ""
    )
    assert "not found" in (
        call(workspace, "edit_file", path="a.py", old_string="z", new_string="q").error or ""
    )
    ok = call(workspace, "edit_file", path="a.py", old_string="y = 1", new_string="y = 2")
    assert ok.error is None and (workspace / "a.py").read_text() == "x = 1\ny = 2\n"
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    edit = EditFile()
    plan = edit.plan(
        edit.args_model.model_validate(
            {"path": "a.py", "old_string": "x = 1", "new_string": "x = 3"}
        ),
        ctx,
    )
    assert plan.before_sha == file_sha(workspace / "a.py") != plan.after_sha


def test_read_output_is_capped_with_a_visible_marker(workspace: Path) -> None:
    (workspace / "big.txt").write_text("".join(f"line {i}\n" for i in range(10_000)))
    out = call(workspace, "read_file", cap=1000, path="big.txt").output
    assert len(out) < 1200
    assert "[... truncated" in out and "line 0" in out and "line 9999" in out
    ranged = call(workspace, "read_file", path="big.txt", offset=10, limit=2).output
    assert ranged.startswith("line 10\nline 11\n") and "[lines 10-12 of 10000]" in ranged


def test_binary_files_are_described_not_dumped(workspace: Path) -> None:
    (workspace / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)) * 10)
    result = call(workspace, "read_file", path="img.png")
    assert result.error and "PNG image" in result.error and "2568 bytes" in result.error
    (workspace / "t.txt").write_text("needle here\n")
    found = call(workspace, "search_text", pattern="needle|PNG").output
    assert found == "t.txt:1: needle here"


def test_list_and_search(workspace: Path) -> None:
    (workspace / "src" / "pkg").mkdir(parents=True)
    (workspace / "src" / "pkg" / "m.py").write_text("def add(a, b):\n    return a - b\n")
    (workspace / "README.md").write_text("def add in docs\n")
    (workspace / ".git").mkdir()
    (workspace / ".git" / "HEAD").write_text("def add")
    listing = call(workspace, "list_files", path=".", max_depth=3).output.splitlines()
    assert "src/" in listing and "src/pkg/m.py" in listing and not any(".git" in x for x in listing)
    assert call(workspace, "list_files", path=".", max_depth=1).output.splitlines() == [
        "README.md",
        "src/",
    ]
    assert (
        call(workspace, "search_text", pattern=r"def add", glob="*.py").output
        == "src/pkg/m.py:1: def add(a, b):"
    )
    assert "invalid regular expression" in (call(workspace, "search_text", pattern="(").error or "")


def test_schemas_come_from_the_argument_models() -> None:
    tools = build_tools("allow")
    assert set(tools) == {
        "list_files",
        "read_file",
        "search_text",
        "write_file",
        "edit_file",
        "run_command",
        "read_output",
    }
    assert "run_command" not in build_tools("deny")
    schema = tool_schema(tools["edit_file"])["function"]
    assert schema["name"] == "edit_file"
    assert set(schema["parameters"]["required"]) == {"path", "old_string", "new_string"}


def test_a_schema_is_generated_once_per_process_and_each_caller_gets_its_own_copy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    class Args(BaseModel):
        path: str

    tool = build_tools("deny")["read_file"]
    made: list[type[BaseModel]] = []
    real = BaseModel.model_json_schema.__func__  # type: ignore[attr-defined]

    def counting(cls: type[BaseModel], *args: Any, **kwargs: Any) -> dict[str, Any]:
        made.append(cls)
        return real(cls, *args, **kwargs)  # type: ignore[no-any-return]

    monkeypatch.setattr(BaseModel, "model_json_schema", classmethod(counting))
    monkeypatch.setattr(tool, "args_model", Args)
    first = tool_schema(tool)
    first["function"]["parameters"]["properties"]["path"]["type"] = "changed by a caller"
    second = tool_schema(tool)
    assert made == [Args]  # a run, or a worker's next run, does not generate it again
    assert second["function"]["parameters"]["properties"]["path"] == {"type": "string"}


def test_edit_keeps_bytes_it_does_not_touch_and_hashes_the_real_file(workspace: Path) -> None:
    # Valid UTF-8 for the first 8 KiB (the binary sniff), then one bad byte, in a file that is
    # otherwise UTF-8 ("mixed"): a strict edit is refused rather than U+FFFD written over it.
    original = "x = 1\n# é\n".encode() + b"# padding\n" * 900 + b"name = 'caf\xe9'\n"
    (workspace / "a.py").write_bytes(original)
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    edit = EditFile()
    args = edit.args_model.model_validate(
        {"path": "a.py", "old_string": "x = 1", "new_string": "x = 2"}
    )
    with pytest.raises(ToolFailure, match="a.py is not UTF-8 text; use write_file"):
        edit.plan(args, ctx)
    result = call(workspace, "edit_file", path="a.py", old_string="x = 1", new_string="x = 2")
    assert result.error and "not UTF-8" in result.error
    assert (workspace / "a.py").read_bytes() == original  # no U+FFFD written over the \xe9
    # read_file still shows it, the bad byte as \xe9 and a note.
    shown = call(workspace, "read_file", path="a.py").output
    assert "name = 'caf\\xe9'" in shown and "1 byte(s) that are not UTF-8" in shown


def test_latin1_text_is_read_and_edited_as_latin1(workspace: Path) -> None:
    original = b"x = 1\n" + b"# padding\n" * 900 + b"name = 'caf\xe9'\n"  # no UTF-8 in it: Latin-1
    (workspace / "a.py").write_bytes(original)
    shown = call(workspace, "read_file", path="a.py").output
    assert "name = 'café'" in shown and "[decoded as latin-1" in shown
    assert (
        call(workspace, "edit_file", path="a.py", old_string="café", new_string="olé").error is None
    )
    assert (workspace / "a.py").read_bytes() == original.replace(
        b"caf\xe9", b"ol\xe9"
    )  # still Latin-1
    refused = call(workspace, "edit_file", path="a.py", old_string="x = 1", new_string="x = '€'")
    assert refused.error and "Latin-1 cannot hold" in refused.error
    assert (workspace / "a.py").read_bytes() == original.replace(b"caf\xe9", b"ol\xe9")


def test_edit_plan_hashes_the_files_bytes(workspace: Path) -> None:
    original = "\ufeffx = 1\r\ny = 'é'\r\n".encode()  # BOM, CRLF, multi-byte: kept as they are
    (workspace / "a.py").write_bytes(original)
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    edit = EditFile()
    args = edit.args_model.model_validate(
        {"path": "a.py", "old_string": "x = 1", "new_string": "x = 2"}
    )
    plan = edit.plan(args, ctx)
    assert plan.before_sha == file_sha(workspace / "a.py") == sha256(original).hexdigest()
    edit.run(args, ctx)
    assert (workspace / "a.py").read_bytes() == original.replace(b"x = 1", b"x = 2")
    assert edit.current_sha(plan, ctx) == plan.after_sha


def test_binary_file_is_described_to_edit_too(workspace: Path) -> None:
    (workspace / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(range(256)))
    result = call(workspace, "edit_file", path="img.png", old_string="PNG", new_string="GIF")
    assert result.error and "PNG image" in result.error


def test_a_file_in_the_way_of_a_folder_is_an_error_not_an_exception(workspace: Path) -> None:
    (workspace / "README.md").write_text("a file\n")
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    write = WriteFile()
    with pytest.raises(ToolFailure, match="README.md/x: README.md is a file, not a directory"):
        write.plan(write.args_model.model_validate({"path": "README.md/x", "content": "x"}), ctx)
    read = call(workspace, "read_file", path="README.md/x/y")
    assert read.error == "README.md/x/y: README.md is a file, not a directory"
    with pytest.raises(ToolFailure, match="is a file, not a directory"):
        file_sha(workspace / "README.md" / "x")
    assert (workspace / "README.md").read_text() == "a file\n"


def test_an_unreadable_file_is_an_error_not_an_exception(
    workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace / "locked.txt").write_text("x")
    real_open = os.open

    def refusing_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if os.fspath(path).endswith(
            "locked.txt"
        ):  # chmod 0 does not stop root, who may run the tests
            raise PermissionError(13, "Permission denied", os.fspath(path))
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refusing_open)  # the file tools open with os.open (FIFO-safe)
    ctx = ToolContext(workspace=workspace, run_id="r", call_id="c")
    write = WriteFile()
    with pytest.raises(ToolFailure, match="locked.txt: permission denied"):
        write.plan(write.args_model.model_validate({"path": "locked.txt", "content": "y"}), ctx)
    assert call(workspace, "read_file", path="locked.txt").error == "locked.txt: permission denied"


def test_a_huge_file_is_refused_without_reading_it_into_memory(workspace: Path) -> None:
    # A command can make a file of any size (`truncate -s 100G`); the harness held what a
    # file tool read in memory, all of it (2 GB of RSS for a 2 GB file, to say "binary").
    import tracemalloc

    size = 256 << 20
    with open(workspace / "big.txt", "wb") as f:
        f.truncate(size)  # sparse: takes no disk
    tracemalloc.start()
    try:
        for name, args in (
            ("read_file", {"path": "big.txt", "limit": 1}),
            ("edit_file", {"path": "big.txt", "old_string": "a", "new_string": "b"}),
        ):
            out = call(workspace, name, **args)
            assert out.error and "more than the 64 MiB a file tool reads" in out.error, out
        assert (
            call(workspace, "search_text", pattern="x").error is None
        )  # skipped, the search goes on
        assert file_sha(workspace / "big.txt") == _zeros_sha(size)  # a hash streams: any size
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20, peak


def _zeros_sha(size: int) -> str:
    h, chunk = sha256(), bytes(1 << 20)
    for _ in range(size >> 20):
        h.update(chunk)
    return h.hexdigest()


def test_search_walks_a_tree_a_thousand_folders_deep(tmp_path: Path) -> None:
    # Python 3.11's os.walk recursed a level a call: RecursionError, a failed run.
    import subprocess

    subprocess.run(
        ["mkdir", "-p", "/".join(["a"] * 1100)], cwd=tmp_path, check=True
    )  # (pathlib's recurses)
    deep = tmp_path.joinpath(*["a"] * 1100)
    (deep / "needle.txt").write_text("the needle\n")
    try:
        found = call(tmp_path, "search_text", pattern="needle")
        assert found.error is None and "needle.txt" in found.output
    finally:
        subprocess.run(["rm", "-rf", "a"], cwd=tmp_path, check=True)  # (shutil.rmtree recurses too)


@pytest.mark.parametrize(
    "name, args",
    [
        ("write_file", {"path": "sub/new.txt", "content": "x"}),
        ("edit_file", {"path": "a.txt", "old_string": "a", "new_string": "b"}),
    ],
)
def test_a_write_into_a_workspace_that_is_gone_does_not_make_a_new_one(
    tmp_path: Path, name: str, args: dict[str, Any]
) -> None:
    # Deleted (or unmounted) under a running run: a write quietly made an empty one in its place.
    ws = tmp_path / "ws"
    ws.mkdir()
    (ws / "a.txt").write_text("a")
    (ws / "a.txt").unlink()
    ws.rmdir()
    result = call(ws, name, **args)
    assert (
        result.error is not None
        and "is gone (deleted or unmounted): nothing was written" in result.error
    )
    assert not ws.exists()


def test_reading_a_small_file_does_not_ask_for_the_whole_cap(workspace: Path) -> None:
    """A buffered read of n bytes allocates n up front: reading a 1 KiB file with
    read(cap + 1) mapped 64 MiB for every read_file step (half a millisecond each)."""
    import tracemalloc

    (workspace / "small.txt").write_text("x" * 1024)
    call(workspace, "read_file", path="small.txt")  # warm: imports, caches
    tracemalloc.start()
    try:
        result = call(workspace, "read_file", path="small.txt")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.error is None and "x" * 100 in result.output
    assert peak < 1 << 20, f"a 1 KiB read_file peaked at {peak:,} bytes"


class _GrowingFile:
    """A file whose stat said one size while it holds another (it grew or shrank since)."""

    def __init__(self, data: bytes) -> None:
        import io

        self._f = io.BytesIO(data)
        self.asked: list[int] = []

    def read(self, n: int) -> bytes:
        self.asked.append(n)
        return self._f.read(n)


def test_a_capped_read_gets_the_files_bytes_up_to_one_past_the_cap_whatever_its_size_said() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from durable_agent.tools.limits import read_capped

    @settings(max_examples=200, deadline=None)
    @given(
        data=st.binary(max_size=5000),
        hint=st.integers(min_value=-1, max_value=6000),
        cap=st.integers(min_value=0, max_value=4000),
    )
    def check(data: bytes, hint: int, cap: int) -> None:
        f = _GrowingFile(data)
        got = read_capped(f, hint, cap)  # type: ignore[arg-type]
        assert got == data[: cap + 1]
        assert max(f.asked) <= max(hint, 0) + 1 or max(f.asked) <= 1 << 20  # never the cap up front

    check()


def test_a_file_larger_than_its_fstat_said_is_read_whole_up_to_the_cap(tmp_path: Path) -> None:
    """A real file that grows between the fstat and the read (the size hint is stale)."""
    from durable_agent.tools.limits import read_capped

    path = tmp_path / "grows.bin"
    path.write_bytes(b"a" * 10)
    with path.open("rb") as f:
        stale = os.fstat(f.fileno()).st_size
        with path.open("ab") as w:
            w.write(b"b" * (3 << 20))
        assert read_capped(f, stale, 4 << 20) == b"a" * 10 + b"b" * (3 << 20)
    with path.open("rb") as f:
        assert read_capped(f, 10, 1 << 20) == (b"a" * 10 + b"b" * (3 << 20))[: (1 << 20) + 1]


def test_the_built_in_tools_schemas_are_generated_current_and_are_what_the_model_is_offered() -> (
    None
):
    import subprocess
    import sys

    from durable_agent.tools.base import generated_parameters
    from durable_agent.tools.schemas import SCHEMAS

    root = Path(__file__).resolve().parent.parent
    check = subprocess.run(
        [sys.executable, str(root / "scripts" / "gen_tool_schemas.py"), "--check"]
    )
    assert check.returncode == 0  # else: run scripts/gen_tool_schemas.py
    tools = build_tools("allow").values()
    assert len(SCHEMAS) == len(tools)
    for tool in tools:
        offered = tool_schema(tool)["function"]["parameters"]
        assert offered == json.loads(generated_parameters(tool.args_model)) and offered.get(
            "properties"
        ), tool.name
