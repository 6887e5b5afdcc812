# The types of the one compiled module (_speedups.c); each function's Python twin is named
# in its docstring there.
from typing import Any

def changed(dir_fd: int, names: list[bytes], cached: dict[bytes, Any]) -> list[bytes]: ...
def index_files(
    body: bytes, hash_size: int, lead: bytes, racy_from: int, root_fd: int, threads: int, /
) -> tuple[dict[bytes, str], dict[bytes, bytes]] | None: ...
def seeded(
    names: list[bytes],
    lead: bytes,
    vouched: dict[bytes, bytes],
    files: dict[bytes, str],
    cached: dict[bytes, Any],
    entries: dict[bytes, Any],
    entry: type[Any],
    kind: str,
    size_cap: int,
    racy_after: int,
    shapes: tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]] | None,
    /,
) -> list[bytes]: ...
def json_rows(paths: list[bytes], manifest: dict[bytes, Any], /) -> bytes | None: ...
def bucketed(paths: list[bytes], /) -> list[list[bytes]]: ...
def joined(paths: list[bytes], manifest: dict[bytes, Any], /) -> bytes: ...
def bucket_lines(paths: list[bytes], manifest: dict[bytes, Any], /) -> list[bytes]: ...
