"""A TCP relay to a real server that can be frozen: it stops moving bytes either way but
keeps every socket open, so the client's kernel goes on acknowledging what it sends and
answering its keepalives, as with a userspace proxy that hung or a SIGSTOPped server.
New connections are accepted while frozen and never answered. `thaw` drops the frozen
connections (a proxy restarted) and relays again."""

from __future__ import annotations

import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress


class Relay:
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.thawed = threading.Event()
        self.thawed.set()
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._generation = 0
        threading.Thread(target=self._accept, daemon=True).start()

    def freeze(self) -> None:
        self.thawed.clear()

    def thaw(self) -> None:
        with self._lock:
            self._generation += 1
            for s in self._open:
                s.close()
            self._open.clear()
        self.thawed.set()

    def close(self) -> None:
        self.listener.close()
        self.thaw()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            with self._lock:
                self._open.append(client)
                generation = self._generation
            threading.Thread(target=self._connect, args=(client, generation), daemon=True).start()

    def _connect(self, client: socket.socket, generation: int) -> None:
        self.thawed.wait()
        try:
            server = socket.create_connection(self.target)
        except OSError:
            client.close()
            return
        with self._lock:
            if generation != self._generation:  # frozen, then thawed: this one was dropped
                server.close()
                return
            self._open.append(server)
        for a, b in ((client, server), (server, client)):
            threading.Thread(target=self._pump, args=(a, b, generation), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, generation: int) -> None:
        try:
            while True:
                self.thawed.wait()
                data = src.recv(65536)
                if not data:
                    break
                self.thawed.wait()  # frozen meanwhile: held, and dropped with the connection at thaw
                if generation != self._generation:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@contextmanager
def relay_to(target: tuple[str, int]) -> Iterator[Relay]:
    relay = Relay(target)
    try:
        yield relay
    finally:
        relay.close()
