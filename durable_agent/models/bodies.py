"""Response bodies read in bounded pieces: an answer up to its cap, an error response's
body before openai reads it whole (see read_error_bodies_capped)."""

from __future__ import annotations

import sys
import zlib
from collections.abc import Callable
from typing import Any

MAX_ERROR_BYTES = 1 << 20  # of an error response's body, decoded: its JSON says what went wrong


def read_error_bodies_capped(openai_client: Any) -> bool:
    """openai reads an error response's body itself, whole: a 0.5 MB gzip body that decodes
    to 512 MiB took 1.6 GB. A response hook reads it first, in pieces, keeping at most
    MAX_ERROR_BYTES; one its Content-Encoding cannot undo is kept empty, so the error is
    still classified by its status (a 401 not retried, a 429's Retry-After kept)."""
    http = getattr(openai_client, "_client", None)
    hooks = getattr(http, "event_hooks", None)
    if not isinstance(hooks, dict) or not isinstance(hooks.get("response"), list):
        return False
    hooks["response"] = [*hooks["response"], _read_error_body]
    http.event_hooks = hooks  # type: ignore[union-attr]
    return True


def _read_error_body(response: Any) -> None:
    if response.status_code < 400 or hasattr(response, "_content"):
        return
    out = bytearray()
    try:
        read_capped(response, MAX_ERROR_BYTES, out)
    except Exception as exc:  # noqa: BLE001 - the status says enough
        if "Timeout" in type(exc).__name__:
            raise  # the whole request's deadline (or a read's) passed: a timeout, as any other
        if "Decoding" in type(exc).__name__:
            out.clear()  # not what its encoding says: nothing of it is kept
        # else cut short: what came is kept (a 401 was retried, a 429's Retry-After lost)
    response.close()
    response._content = bytes(out)


def read_capped(
    response: Any, cap: int, out: bytearray, each: Callable[[], None] | None = None
) -> None:
    """At most `cap` bytes of the decoded body, into `out` as they come; `each` is called
    after every piece (it may raise). gzip and deflate are decoded here with a bound on each
    piece's output (the HTTP library decodes a whole received piece at once: 64 KiB of gzip
    became 150 MB); other encodings by the library. A body its encoding cannot undo raises
    the HTTP library's DecodingError, as the library's own decoders do."""
    try:
        _read(response, cap, out, each)
    except zlib.error as exc:
        library = sys.modules.get(type(response).__module__.partition(".")[0])
        raise getattr(library, "DecodingError", ValueError)(str(exc)) from exc


def _read(response: Any, cap: int, out: bytearray, each: Callable[[], None] | None) -> None:
    encoding = response.headers.get("content-encoding", "").strip().lower()
    if encoding not in ("", "identity", "gzip", "x-gzip", "deflate"):
        for chunk in response.iter_bytes():
            out += chunk[: cap - len(out)]
            if each is not None:
                each()
            if len(out) >= cap:
                return
        return
    unpack = (
        None
        if encoding in ("", "identity")
        else zlib.decompressobj(47 if "gzip" in encoding else 15)
    )
    first = True
    for raw in response.iter_raw():
        if unpack is None:
            out += raw[: cap - len(out)]
        else:
            if (
                first
                and encoding == "deflate"
                and raw[:1]
                and (raw[0] & 0x0F != 8 or int.from_bytes(raw[:2]) % 31)
            ):
                unpack = zlib.decompressobj(
                    -15
                )  # raw deflate, no zlib header (as httpx takes it too)
            data = raw
            while (
                data and len(out) < cap
            ):  # output bounded per call; the rest waits in unconsumed_tail
                out += unpack.decompress(data, cap - len(out))
                data = unpack.unconsumed_tail
        first = first and not raw
        if each is not None:
            each()
        if len(out) >= cap:
            return
