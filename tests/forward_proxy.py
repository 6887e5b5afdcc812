"""A minimal HTTP forward proxy for tests: `POST http://host:port/path` relayed with the
path made relative, both ways, one thread per connection. Records each request line."""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from collections.abc import Callable

_ABSOLUTE = re.compile(rb"^([A-Z]+ )http://[^/]+(/)", re.MULTILINE)


def _pipe(
    src: socket.socket, dst: socket.socket, rewrite: Callable[[bytes], bytes] | None = None
) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(rewrite(data) if rewrite else data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


class ForwardProxy:
    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._server.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._server.close()

    def _accept(self) -> None:
        try:
            while True:
                conn, _ = self._server.accept()
                threading.Thread(target=self._relay, args=(conn,), daemon=True).start()
        except OSError:
            pass  # closed

    def _relay(self, client: socket.socket) -> None:
        head = b""
        while b"\r\n" not in head:
            data = client.recv(65536)
            if not data:
                client.close()
                return
            head += data
        line = head.split(b"\r\n", 1)[0]
        self.lines.append(line)
        target = re.match(rb"[A-Z]+ http://([^/:]+):(\d+)/", line)
        if target is None:
            client.close()
            return
        upstream = socket.create_connection((target[1].decode(), int(target[2])))

        def relative(data: bytes) -> bytes:
            return _ABSOLUTE.sub(rb"\1\2", data)

        upstream.sendall(relative(head))
        threading.Thread(target=_pipe, args=(client, upstream, relative), daemon=True).start()
        _pipe(upstream, client)
