"""Where an SQL store is, read from its URL: the file an SQLite URL (or plain path) names,
the files it writes beside it, whether it lives only in memory. Pure functions of the URL the
caller resolved once (settings, `--db`), so the store needs nothing of the config layers."""

from __future__ import annotations

import os
from pathlib import Path
from urllib.parse import parse_qsl, unquote


def sqlite_url(path: Path) -> str:
    """The `sqlite:///` URL of a file, naming that very file: in a URL, `?` starts the
    options and `%XX` is an escape, so a path holding them is escaped (`st?x.db` would
    otherwise open `st`)."""
    return "sqlite:///" + str(path).replace("%", "%25").replace("?", "%3F")


def uri_flag(value: object) -> bool:
    """Is a URL's `uri=` option on? The words SQLAlchemy reads as true."""
    return str(value).strip().lower() in ("true", "yes", "on", "y", "t", "1")


def sqlite_target(db: str) -> tuple[str, str] | None:
    """(database, query) of an SQLite store URL or plain path; None for another database.
    A URL's database is %-decoded, as SQLAlchemy decodes it before opening the file."""
    if "://" not in db:
        return db, ""
    scheme, _, rest = db.partition("://")
    if scheme.split("+")[0] != "sqlite":
        return None
    database, _, query = rest.removeprefix("/").partition("?")
    return unquote(database), query


def in_memory(db: str) -> bool:
    """An SQLite URL whose database lives only in this process: `sqlite://`, `sqlite:///`
    (no file name), `sqlite+pysqlite:///:memory:`, `file::memory:` and `mode=memory` URIs."""
    target = sqlite_target(db)
    if target is None:
        return False
    database, query = target
    return (
        database in ("", ":memory:")
        or database.startswith("file::memory:")
        or "mode=memory" in query
        or "mode=memory" in database
    )


def sqlite_file(db: str) -> Path | None:
    """The file of an SQLite store (a `sqlite:///` URL or a plain path), resolved; None for
    another database or an in-memory one."""
    target = sqlite_target(db)
    if target is None or in_memory(db):
        return None
    database, query = target
    if "://" not in db:
        return Path(
            os.path.realpath(os.path.expanduser(database))
        )  # `~`: the home folder in a plain path only
    if database.startswith("file:") and uri_flag(dict(parse_qsl(query)).get("uri", "")):
        # An SQLite URI: file:PATH, file:///PATH or file://localhost/PATH, %-escapes decoded by SQLite.
        path = database.removeprefix("file:").partition("?")[0].partition("#")[0]
        if path.startswith("//"):
            path = "/" + path[2:].partition("/")[2]
        database = unquote(path)
    return Path(os.path.realpath(database))


def store_files(db: str) -> tuple[str, ...]:
    """The real paths an SQLite store writes (the file, -wal, -shm, -journal, the MCP log
    folder next to it); () for another database."""
    file = sqlite_file(db)
    if file is None:
        return ()
    return (
        str(file),
        f"{file}-wal",
        f"{file}-shm",
        f"{file}-journal",
        str(file.parent / "mcp-logs"),
    )


def store_key(db: str) -> str:
    """The same text for every spelling of one store's URL (its live channel's name,
    durable_agent/live.py): an SQLite store's real file, else the database's host, port and
    name (driver, user and password left out)."""
    file = sqlite_file(db)
    if file is not None:
        return f"sqlite:{file}"
    from urllib.parse import urlsplit

    try:
        url = urlsplit(db)
        port = url.port
    except ValueError:
        return db
    scheme = url.scheme.partition("+")[0]
    if scheme in ("postgres", "postgresql"):
        scheme, port = "postgresql", port or 5432
    return f"{scheme}://{url.hostname or ''}:{port or ''}{url.path}"
