"""Connections: URL normalisation, SQLite pragmas and locking, automatic migrations.

SQLite is shared by several processes (a `start`, a `cancel` from another shell, workers),
so every connection gets WAL, a busy timeout and foreign keys, and every write
transaction takes the lock up front (`BEGIN IMMEDIATE`): a deferred transaction that
upgrades to a writer late can fail with SQLITE_BUSY regardless of the timeout.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
import weakref
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from durable_agent.errors import ConfigError, StoreError, StoreFileGone, StoreUnavailable
from durable_agent.store import retrying
from durable_agent.store.location import sqlite_file, sqlite_url, uri_flag
from durable_agent.store.revision import HEAD_REVISION
from durable_agent.store.storable import is_utf8, lenient_text, read_json

BUSY_TIMEOUT_MS = 30_000

# Every engine made here, for `dispose_all` at the end of the process's own command.
_ENGINES: weakref.WeakSet[Engine] = weakref.WeakSet()

# SQLAlchemy's pool logs a connection it could not reset as it took it back (the server
# closed it: a take-over's fencing, a restart) with its traceback, which logging's last
# resort printed under the one line the store's own error says. A handler here keeps the
# record from that last resort; an application's own logging configuration still gets it.
logging.getLogger("sqlalchemy.pool").addHandler(logging.NullHandler())


def dispose_all() -> None:
    """Close the connections of every engine still open: the CLI's process ends without the
    collections that would otherwise close them (cli/collector.py), and SQLite checkpoints its
    WAL into the store when its last connection closes (no `-wal` file is left behind)."""
    for engine in list(_ENGINES):
        # The command's exit code is decided: a failure to close must not replace it.
        with contextlib.suppress(Exception):
            engine.dispose()


def normalize_url(url: str) -> str:
    """Bare `postgresql://` means psycopg 3 here; a plain path means an SQLite file."""
    if not is_utf8(url):  # bytes that are not UTF-8, carried as surrogates
        raise ConfigError(
            f"cannot use the store {url!r}: its name is not valid UTF-8 (rename the file "
            "or the folder)"
        )
    if url.startswith(("postgresql://", "postgres://")):
        return "postgresql+psycopg://" + url.split("://", 1)[1]
    if "://" not in url:
        return sqlite_url(Path(url).expanduser().absolute())
    return url


def make_engine(
    url: str, *, durability: str = "full", pool_size: int | None = None, lease_seconds: float = 30.0
) -> Engine:
    """`pool_size`: connections kept open; a worker running N runs at once (each with a
    heartbeat thread) needs about 2N + 2, more than the default 5 + 10 overflow.
    `lease_seconds`: the runs' lease; on PostgreSQL no transaction of ours stays idle longer."""
    engine = _make_engine(url, durability, pool_size, lease_seconds)
    _ENGINES.add(engine)
    return engine


def _make_engine(url: str, durability: str, pool_size: int | None, lease_seconds: float) -> Engine:
    url = normalize_url(url)
    pool = {} if pool_size is None else {"pool_size": pool_size, "max_overflow": pool_size}
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise ConfigError(f"not a database URL: {url!r} (e.g. sqlite:///path/to/file.db)") from None
    try:
        if parsed.get_backend_name() == "sqlite":
            _check_sqlite_options(url, parsed.query)
            return _sqlite_engine(url, parsed.database, durability, pool)
        binding = _client_binding(parsed.get_driver_name())
        if parsed.get_driver_name() == "psycopg":
            binding["connect_args"].update(_silence_bounds(parsed.query))
        engine = create_engine(
            url, pool_pre_ping=True, json_deserializer=read_json, **pool, **binding
        )
        event.listen(engine, "handle_error", _lost_is_disconnect)
        if parsed.get_driver_name() == "psycopg":
            event.listen(engine, "checkin", _not_autocommit)
        if parsed.get_backend_name() == "postgresql":
            _end_idle_transactions(engine, lease_seconds)
        return engine
    except NoSuchModuleError:
        raise ConfigError(f"no database driver for {parsed.drivername!r}") from None
    except (
        ArgumentError
    ) as exc:  # a URL the dialect refuses (`sqlite://file.db`: a host, not a file)
        raise ConfigError(
            f"cannot use the store {url!r}: {str(exc).splitlines()[0]} "
            "(e.g. sqlite:///path/to/file.db)"
        ) from None
    except ModuleNotFoundError as exc:
        raise ConfigError(
            f"the driver for {parsed.drivername} is not installed ({exc.name}); "
            "for PostgreSQL: pip install 'durable-agent[postgres]'"
        ) from None


# A server that goes silent (a partition, a proxy that stopped forwarding, a half-open
# socket) held `list` or a worker forever: libpq waits without end by default. Connecting
# takes at most connect_timeout; an idle connection waiting for an answer is probed by TCP
# keepalives (dead after ~25 s of silence); data the peer does not acknowledge within
# tcp_user_timeout drops the connection. Each ends as a lost connection, retried by the
# store's policy and then exit 7, like any other. What the user set takes precedence
# (_silence_bounds).
SILENCE_BOUNDS = {
    "connect_timeout": 10,
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
    "tcp_user_timeout": 30_000,
}


def _silence_bounds(query: Mapping[str, Any]) -> dict[str, Any]:
    """SILENCE_BOUNDS but for what the user set by libpq's own means, which would otherwise
    lose to these: the URL's parameters, PGCONNECT_TIMEOUT, and what a named service's
    file sets (psycopg reads no connect_timeout from a service: without one of ours, a
    silent server held the connect for its default of 130 s)."""
    given = set(query) | ({"connect_timeout"} if os.environ.get("PGCONNECT_TIMEOUT") else set())
    service = query.get("service") or os.environ.get("PGSERVICE")
    if isinstance(service, str) and service:
        given |= _service_keys(service)
    return {k: v for k, v in SILENCE_BOUNDS.items() if k not in given}


def _service_keys(name: str) -> set[str]:
    """The parameters a libpq service file sets for service `name` (the user's file, then
    PGSYSCONFDIR's); none when it is in neither (libpq then says so itself)."""
    import configparser

    home = os.environ.get("PGSERVICEFILE") or os.path.expanduser("~/.pg_service.conf")
    system = os.path.join(os.environ.get("PGSYSCONFDIR", ""), "pg_service.conf")
    for path in (home, system) if os.environ.get("PGSYSCONFDIR") else (home,):
        parser = configparser.ConfigParser(interpolation=None)
        try:
            parser.read(path, encoding="utf-8")
        except (configparser.Error, OSError, UnicodeDecodeError):
            continue
        if parser.has_section(name):
            return {key.strip().lower() for key in parser[name]}
    return set()


def _client_binding(driver: str) -> dict[str, Any]:
    """psycopg 3 binds values on the server: they follow the statement's text in a message
    of their own (Bind), which the server reads as part of a query already begun. An owner
    frozen halfway through sending a large one (SIGSTOP, a paused VM) would leave the server
    waiting for the rest, the run's row lock held, and no timeout ends that. Bound into the
    text (`ClientCursor`, as psycopg2 always did), a message holds whole statements (a
    checkpoint sends several in one: store/prepared.py); halfway through one the server is
    still idle in the transaction, and the timeout below ends it (tests/test_prepared.py
    stops a checkpoint halfway through a 400 KB row). Several rows (Core's executemany: snapshot blobs, a run's first messages) go one statement
    at a time, each waiting for its answer: psycopg sends them in a pipeline, and mid-pipeline
    the server waits for the rest of a query, where no timeout applies either."""
    if driver != "psycopg":
        return {}
    from psycopg import ClientCursor

    class OneAtATime(ClientCursor[Any]):
        def executemany(self, query: Any, params_seq: Any, *, returning: bool = False) -> None:
            if returning:  # results of each statement kept: only psycopg's own way does that
                super().executemany(query, params_seq, returning=True)
                return
            for params in params_seq:
                self.execute(query, params)

    return {"connect_args": {"cursor_factory": OneAtATime}}


def _end_idle_transactions(engine: Engine, lease_seconds: float) -> None:
    """An owner frozen inside a checkpoint (SIGSTOP, a VM paused, a partition) holds its run's
    row lock from the fence to COMMIT, and would hold it for as long as it stays frozen: no
    takeover could ever write the run. The server ends a session of ours idle inside a
    transaction for longer than the lease, so the lock goes as the lease does; the owner, if
    it thaws, finds its connection gone, and then its lease (exit 6). No transaction of ours
    waits on anything but the database while open."""
    ms = max(1, min(int(lease_seconds * 1000), 2**31 - 1))  # the setting's range

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        with dbapi_conn.cursor() as cur:
            cur.execute(f"SET idle_in_transaction_session_timeout = {ms}")
        dbapi_conn.commit()


def _not_autocommit(dbapi_conn: Any, _record: Any) -> None:
    """Back in the pool, a connection begins its transactions as psycopg does: a checkpoint
    cut short between its end and its clean-up (a second Ctrl-C) could leave the
    autocommit it sets for its own BEGIN (store/prepared.py)."""
    if dbapi_conn is not None and dbapi_conn.autocommit:
        with contextlib.suppress(Exception):  # one that refuses is broken, and dropped
            dbapi_conn.autocommit = False


def _lost_is_disconnect(context: Any) -> None:
    """A connection lost where the dialect does not look (inside psycopg's pipeline) is
    invalidated like any disconnect: never reset and handed out again."""
    if not context.is_disconnect and context.original_exception is not None:
        context.is_disconnect = retrying.connection_lost(context.original_exception)


# What the pysqlite dialect reads from a URL's query; it ignores anything else with a warning
# unless the URL is an SQLite URI (uri=true), which SQLite itself reads.
_PYSQLITE_OPTIONS = {
    "timeout",
    "isolation_level",
    "detect_types",
    "check_same_thread",
    "cached_statements",
    "uri",
}


def _check_sqlite_options(url: str, query: Mapping[str, Any]) -> None:
    """`sqlite:///x.db?mode=ro` would open x.db for writing after a three-line warning: an
    option that would be ignored is refused instead, in one line."""
    if uri_flag(query.get("uri", "")):
        return
    ignored = sorted(set(query) - _PYSQLITE_OPTIONS)
    if ignored:
        raise ConfigError(
            f"cannot use the store {url!r}: SQLite reads {', '.join(map(repr, ignored))} only in "
            "an SQLite URI (add uri=true, e.g. sqlite:///file:store.db?mode=ro&uri=true)"
        )


def _sqlite_engine(url: str, database: str | None, durability: str, pool: dict[str, int]) -> Engine:
    if database and database != ":memory:":
        try:
            Path(database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create the database folder for {database}: {exc}") from None
        if Path(database).exists() and not Path(database).is_file():
            # /dev/null, a FIFO, a folder: SQLite opens some of them and then fails each
            # write with "disk I/O error", which would read as a passing fault (exit 7).
            raise ConfigError(
                f"cannot use the store {url}: not a regular file (--db must be a "
                "durable-agent SQLite file, or a new path in a writable folder)"
            )
    engine = create_engine(
        url,
        connect_args={"timeout": BUSY_TIMEOUT_MS / 1000},
        json_deserializer=read_json,
        **(pool if database and database != ":memory:" else {}),
    )
    synchronous = "FULL" if durability == "full" else "NORMAL"
    file = sqlite_file(url)
    same_file = SameFile(str(file)) if file is not None else None

    if same_file is not None:

        @event.listens_for(engine, "do_connect")
        def _before_connect(*_: Any) -> None:
            # Before SQLite opens the path: opening a deleted store would create an empty
            # file in its place.
            same_file.check()

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn: Any, _record: Any) -> None:
        # Take transaction control away from the sqlite3 module so we can BEGIN IMMEDIATE.
        dbapi_conn.isolation_level = None
        dbapi_conn.text_factory = lenient_text
        cur = dbapi_conn.cursor()
        cur.execute("PRAGMA journal_mode=WAL")
        cur.execute(f"PRAGMA synchronous={synchronous}")
        cur.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys=ON")
        cur.close()
        if same_file is not None:
            same_file.note()
            _record.info[SAME_FILE] = same_file  # for the checkpoints' own BEGIN (prepared.py)

    @event.listens_for(engine, "begin")
    def _on_begin(conn: Any) -> None:
        # Readers (list, show, export) ask for a deferred transaction so they never block writers.
        # Sent on the sqlite3 connection itself: through exec_driver_sql it cost half the CPU
        # of a whole Core statement, twice per step. (Cursor events and echo do not see it.)
        sql = "BEGIN" if conn.get_execution_options().get("readonly") else "BEGIN IMMEDIATE"
        if same_file is not None:
            same_file.check(conn.connection.driver_connection)
        try:
            conn.connection.driver_connection.execute(sql)
        except sqlite3.Error as exc:  # raised as SQLAlchemy would: callers catch its DBAPIError
            raise DBAPIError.instance(sql, None, exc, sqlite3.Error) from exc

    return engine


SAME_FILE = "durable_agent.same_file"
"""Key of a SQLite connection's `SameFile` in its pool record's `info`."""


class SameFile:
    """That a SQLite store is still the file it was when first opened (device and inode).

    A store deleted under a run went unnoticed: its open connections wrote on into the
    unlinked file, the run ended `completed` and nothing of it remained; a file put in its
    place was opened by the next connection and written over, the replacement's own run
    lost. Checked before every transaction (a stat: a few microseconds, where a checkpoint
    takes milliseconds) and before every new connection; a change stops the process at once
    (StoreFileGone: exit 7)."""

    __slots__ = ("identity", "path", "wal")

    def __init__(self, path: str) -> None:
        self.path = path
        self.identity: tuple[int, int] | None = None
        self.wal: tuple[int, int] | None = None  # the -wal last seen at its path

    def note(self) -> None:
        """After a connection opened the file: the first one sets what it must stay."""
        if self.identity is None:
            try:
                st = os.stat(self.path)
            except OSError:
                return  # a SQLite URI naming no file on disk (an in-memory one)
            self.identity = (st.st_dev, st.st_ino)
        else:
            self.check()

    def check(self, dbapi_conn: Any = None) -> None:
        """Raises StoreFileGone when the path names no file, or another. `dbapi_conn`: an
        open connection of ours, through which our write-ahead log is emptied first."""
        if self.identity is None:
            return
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            self._empty_log(dbapi_conn)
            raise StoreFileGone(self.path, "deleted") from None
        except OSError:
            return  # a folder we may not look into now: the transaction will say what is wrong
        if (st.st_dev, st.st_ino) != self.identity:
            self._empty_log(dbapi_conn)
            raise StoreFileGone(self.path, "replaced by another file")
        if dbapi_conn is not None and self._log_deleted():
            # Our commits go on into the unlinked log and die with this process (a run
            # killed then was lost whole): checkpointed into the file first, they stay.
            self._empty_log(dbapi_conn)
            raise StoreFileGone(self.path, "left without its write-ahead log (-wal deleted)")

    def _log_deleted(self) -> bool:
        """This process holds open a `-wal` of the store that is no longer at its path.
        A stat while the log is the one seen last; /proc/self/fd looked at only when not
        (SQLite itself deletes the log when its last connection closes)."""
        wal = os.path.realpath(self.path) + "-wal"
        try:
            st = os.stat(wal)
            seen: tuple[int, int] | None = (st.st_dev, st.st_ino)
        except FileNotFoundError:
            seen = None
        except OSError:
            return False
        if seen is not None and seen == self.wal:
            return False
        self.wal = seen
        with contextlib.suppress(OSError):
            for fd in os.listdir("/proc/self/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/self/fd/{fd}") == wal + " (deleted)":
                        return True
        return False

    @staticmethod
    def _empty_log(dbapi_conn: Any) -> None:
        """Our write-ahead log (`-wal`, found by name) holds pages of our file: left there, the
        next store opened at the path would read them as its own (that wiped a replacement's
        run). Checkpointed into our old file, through our open handles, it is empty."""
        if dbapi_conn is not None:
            with contextlib.suppress(Exception):
                dbapi_conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").close()


@contextmanager
def _opening(engine: Engine) -> Iterator[None]:
    """A store that cannot be used at all (a text file, a truncated or read-only database, a
    folder we cannot write): one line that names it, exit 2, instead of a driver traceback."""
    try:
        yield
    except DBAPIError as exc:
        if retrying.is_transient(exc):
            raise  # not there yet (server restarting, locked): the caller waits, then exit 7
        where = engine.url.render_as_string(hide_password=True)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        hint = ""
        if engine.url.get_backend_name() == "sqlite":
            hint = " (--db must be a durable-agent SQLite file, or a new path in a writable folder)"
            folder = Path(engine.url.database or ".").parent
            if folder.is_dir() and not os.access(folder, os.W_OK):
                hint = (
                    " (its folder is read-only, and this command writes beside the store; `list` and "
                    "`show` read a store there)"
                )
        raise ConfigError(f"cannot use the store {where}: {reason}{hint}") from None


def current_revision(engine: Engine) -> str | None:
    """The schema's Alembic revision; None for a database without one (a new store)."""
    with _opening(engine):
        try:
            with engine.connect() as conn:
                return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()
        except DBAPIError as exc:
            # "no such table" (SQLite) / UndefinedTable (PostgreSQL): nothing created yet.
            # Anything else (I/O error, connection refused, not a database) is a real fault.
            if "alembic_version" in str(exc.orig) and not retrying.is_transient(exc):
                return None
            raise


def _make_sqlite_head(engine: Engine) -> bool:
    """Make an empty SQLite file a store at head, in one transaction, from the statements
    generated from the migrations (store/head_sqlite.py): importing Alembic and running
    every migration cost each new store a third of a second. False, with nothing done, when
    the file holds anything (another process made the store meanwhile, or it holds tables
    of its own): the migrations decide then, as for any store that is not new."""
    from durable_agent.store import head_sqlite

    with _opening(engine), engine.begin() as conn:  # BEGIN IMMEDIATE: one maker at a time
        if conn.exec_driver_sql("SELECT count(*) FROM sqlite_master").scalar():
            return False
        for statement in head_sqlite.STATEMENTS:
            conn.exec_driver_sql(statement)
        conn.exec_driver_sql(
            "INSERT INTO alembic_version (version_num) VALUES (?)", (head_sqlite.REVISION,)
        )
    return True


def migrations_dir() -> Path:
    """Installed: durable_agent/migrations. Source checkout: the top-level alembic/ folder."""
    package = Path(__file__).resolve().parent.parent
    for candidate in (package / "migrations", package.parent / "alembic"):
        if (candidate / "env.py").exists():
            return candidate
    raise ConfigError(
        "the database migrations are missing from this installation; reinstall durable-agent"
    )


def upgrade(engine: Engine, revision: str = "head") -> None:
    # Imported here: alembic is only needed when the schema is behind (first use, upgrades).
    from alembic.config import Config
    from alembic.util import CommandError

    from alembic import command

    cfg = Config()
    cfg.set_main_option("script_location", str(migrations_dir()))
    with _opening(engine), engine.begin() as conn:
        cfg.attributes["connection"] = conn
        try:
            command.upgrade(cfg, revision)
        except CommandError as exc:  # e.g. a revision from a newer durable-agent
            raise ConfigError(
                f"cannot upgrade the store: {exc} (was it made by a newer durable-agent?)"
            ) from None


def ensure_schema(engine: Engine, policy: retrying.StorePolicy | None = None) -> None:
    """Upgrade to head when behind; a cheap single SELECT when already there (every start).

    A store that is not there yet (server restarting, connection refused, locked) is waited
    for under the store policy, then StoreUnavailable (exit 7); one that cannot be a store
    (not a database, no permission, a bad schema) is a ConfigError (exit 2).
    """
    policy = policy or retrying.StorePolicy()
    try:
        rev = retrying.run(lambda: current_revision(engine), policy)
        if (
            rev is None
            and engine.dialect.name == "sqlite"
            and retrying.run(lambda: _make_sqlite_head(engine), policy)
        ):
            return
        if rev != HEAD_REVISION:
            retrying.run(lambda: upgrade(engine), policy)
    except StoreUnavailable:
        raise
    except StoreError as exc:
        raise ConfigError(
            f"cannot open the database: {str(exc).removeprefix('the database refused a statement: ')}"
        ) from None


def open_store_engine(
    url: str,
    *,
    durability: str = "full",
    pool_size: int | None = None,
    policy: retrying.StorePolicy | None = None,
    lease_seconds: float = 30.0,
) -> Engine:
    engine = make_engine(
        url, durability=durability, pool_size=pool_size, lease_seconds=lease_seconds
    )
    ensure_schema(engine, policy)
    if engine.dialect.driver == "psycopg":  # (after the schema: a migration may rightly take long)
        from durable_agent.store.silence import WATCHDOG, silence_bound

        WATCHDOG.watch(engine, silence_bound(lease_seconds))
    return engine
