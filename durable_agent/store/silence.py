"""A PostgreSQL server that stops answering while its host still acknowledges every byte
(a userspace proxy that hung, a SIGSTOPped or paused server): TCP keepalives are answered
and nothing sent goes unacknowledged, so neither they nor tcp_user_timeout ever fire, and
libpq waits for the answer for ever, holding a run, a worker or `resume` with it.

The watchdog looks at the store's connections from one thread of its own and asks the
kernel (TCP_INFO) when each last sent and received data: a connection waiting on a command
(libpq says one is in progress) that has neither sent nor received a byte for `bound`
seconds is waiting on a server that stopped answering. Its socket is shut down; the driver's wait ends as a lost connection, and the
store's retries take over as for any other (a new connection, then exit 7 while the server
stays silent). The bound is twice the lease: a run's longest legitimate waits are for a row
or the claim lock, which a holder idle in its transaction loses within a lease
(engine._end_idle_transactions); a holder running a command that long (a migration, a
COMMIT on a stalled disk) is treated as a silent server.

Linux only (TCP_INFO); a connection over a Unix socket is not watched.
"""

from __future__ import annotations

import contextlib
import os
import socket
import struct
import threading
import time
import weakref
from typing import Any

from sqlalchemy import Engine, event

# struct tcp_info (linux/tcp.h): 8 bytes of u8 fields, then u32s; tcpi_last_data_sent and
# tcpi_last_data_recv, in milliseconds ago, are the 10th and 12th of them (a stable ABI).
_LAST_DATA_SENT = 8 + 9 * 4
_LAST_DATA_RECV = 8 + 11 * 4
_TCP_INFO = getattr(socket, "TCP_INFO", None)
_ACTIVE = 1  # psycopg.pq.TransactionStatus.ACTIVE (not imported: psycopg is optional)
MIN_BOUND_S = 10.0


def silence_bound(lease_seconds: float) -> float:
    return max(MIN_BOUND_S, 2 * lease_seconds)


class Watchdog:
    """The connections of the engines it watches and the thread that looks at them every
    quarter of the bound. Held weakly (a connection the pool dropped is gone here too), in a
    plain dict by id: its copy is one C call, so registering needs no lock (iterating a
    WeakKeyDictionary while another thread adds to it raises, and would end the thread)."""

    def __init__(self) -> None:
        # Held while a socket is looked at, and by a pool closing one: the descriptor is never
        # closed (and its number reused) under the look. Re-entrant: a connection the garbage
        # collector finalizes inside the look, in this thread, is closed through `closing`.
        self._lock = threading.RLock()
        self._conns: dict[int, tuple[weakref.ref[Any], float]] = {}
        self._started = threading.Lock()
        self._thread: threading.Thread | None = None
        self.cuts = 0

    def watch(self, engine: Engine, bound_s: float) -> None:
        if _TCP_INFO is None:
            return

        def connected(dbapi_conn: Any, _record: Any) -> None:
            self.register(dbapi_conn, bound_s)

        def closing(dbapi_conn: Any, *_: Any) -> None:  # before the pool closes it
            if dbapi_conn is None:
                return
            # Waits out a look under way (microseconds); should the watchdog ever be stuck,
            # it is not waited for: nothing store-wide may hang on it.
            got = self._lock.acquire(timeout=5)
            try:
                self._conns.pop(id(dbapi_conn), None)
            finally:
                if got:
                    self._lock.release()

        def checked_out(
            dbapi_conn: Any, _record: Any, _proxy: Any
        ) -> None:  # one made before watch()
            if self._watched(dbapi_conn) is None:
                self.register(dbapi_conn, bound_s)

        event.listen(engine, "connect", connected)
        event.listen(engine, "checkout", checked_out)
        for name in ("close", "invalidate", "detach", "close_detached"):
            event.listen(engine, name, closing)

    def register(self, dbapi_conn: Any, bound_s: float) -> None:
        self._conns[id(dbapi_conn)] = (weakref.ref(dbapi_conn), bound_s)
        if self._thread is None:
            with self._started:
                if self._thread is None:
                    self._thread = threading.Thread(
                        target=self._run, name="store-silence", daemon=True
                    )
                    self._thread.start()

    def _watched(self, dbapi_conn: Any) -> float | None:
        """Its bound, if this very connection is watched (an id outlives its object)."""
        entry = self._conns.get(id(dbapi_conn))
        return entry[1] if entry is not None and entry[0]() is dbapi_conn else None

    def _run(self) -> None:
        while True:
            time.sleep(
                min((bound for _, bound in list(self._conns.values())), default=MIN_BOUND_S) / 4
            )
            self.look()

    def look(self) -> None:
        """Cut every watched connection silent for longer than its bound."""
        for key, (ref, bound) in list(self._conns.items()):
            conn = ref()
            if conn is None:  # dropped without a close event: forget it (not a newcomer of its id)
                if (entry := self._conns.get(key)) is not None and entry[0] is ref:
                    self._conns.pop(key, None)
                continue
            with self._lock:  # (a connection closed meanwhile was dropped by `closing`)
                if self._watched(conn) is not None and _silent_for(conn) > bound * 1000:
                    self._conns.pop(key, None)
                    _cut(conn)
                    self.cuts += 1
            del conn  # not kept alive through the next sleep


def _silent_for(dbapi_conn: Any) -> int:
    """Milliseconds the connection has been waiting on a command with no byte moving either
    way (a long upload is not silence); 0 when no command is in progress or it cannot tell."""
    try:
        if dbapi_conn.pgconn.transaction_status != _ACTIVE:  # libpq: a command is in progress
            return 0
    except Exception:  # noqa: BLE001 - closed meanwhile
        return 0
    info = _tcp_info(dbapi_conn)
    if info is None:
        return 0
    sent: int = struct.unpack_from("=I", info, _LAST_DATA_SENT)[0]
    received: int = struct.unpack_from("=I", info, _LAST_DATA_RECV)[0]
    return min(sent, received)


def _tcp_info(dbapi_conn: Any) -> bytes | None:
    with (
        contextlib.suppress(Exception),
        _own_socket(dbapi_conn) as sock,
    ):  # closed, an old kernel: not watched
        if sock.family in (socket.AF_INET, socket.AF_INET6):
            return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 104)  # type: ignore[arg-type]
    return None


def _cut(dbapi_conn: Any) -> None:
    """Shut the socket down (both ways): the driver's wait on it ends at once, as a connection
    the server closed. The descriptor stays the driver's, closed when it drops the connection."""
    with contextlib.suppress(Exception), _own_socket(dbapi_conn) as sock:
        sock.shutdown(socket.SHUT_RDWR)


def _own_socket(dbapi_conn: Any) -> socket.socket:
    """A socket object on a copy of the driver's descriptor (closing it leaves the driver's)."""
    fd = os.dup(
        dbapi_conn.fileno()
    )  # psycopg: libpq's socket; raises once the connection is closed
    try:
        return socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        raise


WATCHDOG = Watchdog()
