"""Who may talk to the web view, as one ASGI middleware in front of every route:

- with a token, every request carries it: `Authorization: Bearer TOKEN`, or the cookie
  that `/?token=TOKEN` sets (the address bar then drops the token: a redirect);
- without one (loopback only), the Host header must be a loopback name, so a page on
  another site cannot reach the view by rebinding a DNS name to 127.0.0.1; pages may be
  read, but acting (a POST) takes the key the command printed in its link, made anew at
  each start: a program on this machine (an agent's command, with the network on, shares
  the loopback) can read every page and the CSRF token in it, but not the terminal;
- a Host header must be a plain `name[:port]` (403 otherwise); a POST must come from our
  own pages: an Origin, when sent, must be this host (`null` is refused), and the
  form must carry the CSRF token that only our pages hold (no CORS headers are ever sent,
  so another site cannot read it);
- request bodies are limited in size (actions are a few short form fields).
"""

from __future__ import annotations

import hmac
import re
import secrets
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from msgspec import Struct, field
from starlette.requests import cookie_parser

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

COOKIE = "durable_agent_token"
MAX_BODY = 16 * 1024
LOOPBACK_NAMES = {"127.0.0.1", "localhost", "::1", "[::1]"}
HEADERS = [  # what every answer says about itself
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    # same-origin, not no-referrer: under no-referrer a browser sends `Origin: null` with
    # our own forms' POSTs, which would then be indistinguishable from a sandboxed frame's
    # (refused); other sites still get no Referer.
    (b"referrer-policy", b"same-origin"),
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self' 'unsafe-inline'; frame-ancestors 'none'",
    ),
]


class Access(Struct, frozen=True):
    token: str | None = None
    csrf: str = field(default_factory=lambda: secrets.token_urlsafe(24))
    key: str = field(default_factory=lambda: secrets.token_urlsafe(24))  # to act, without a token
    on_link: Callable[[], None] | None = None  # called as the link is used

    def token_ok(self, offered: str | None) -> bool:
        return self.token is None or (
            offered is not None and hmac.compare_digest(offered.encode(), self.token.encode())
        )

    @property
    def link_secret(self) -> str:
        """What the printed link carries: the token, or without one the key."""
        return self.token if self.token is not None else self.key

    def act_ok(self, offered: str | None) -> bool:
        """May act (POST): holds the link's secret."""
        return offered is not None and hmac.compare_digest(
            offered.encode(), self.link_secret.encode()
        )

    def csrf_ok(self, offered: str | None) -> bool:
        return offered is not None and hmac.compare_digest(offered.encode(), self.csrf.encode())


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers", [])}


def _offered_token(headers: dict[str, str]) -> str | None:
    auth = headers.get("authorization", "")
    if auth.lower().startswith("bearer "):
        return auth[7:].strip()
    # Leniently, as browsers send them: one odd cookie of another app on localhost (a bare
    # name, a space, JSON) made the standard library's parser drop the whole header.
    return cookie_parser(headers.get("cookie", "")).get(COOKIE)


_HOST = re.compile(r"(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9.-]+)(:[0-9]{1,5})?")


def _host_name(host: str) -> str | None:
    """The name in a Host header, or None when the header is not a plain `name[:port]` or
    `[v6][:port]`: `localhost:1@evil.com` is no loopback name, whatever a lenient split says."""
    found = _HOST.fullmatch(host)
    return found.group(1).lower() if found else None


async def _plain(
    send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None
) -> None:
    body = (text + "\n").encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                *HEADERS,
                *(extra or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Guard:
    """The middleware. `access.token` None means loopback only (the CLI refuses otherwise)."""

    def __init__(self, app: ASGIApp, access: Access, *, max_body: int = MAX_BODY) -> None:
        self.app, self.access, self.max_body = app, access, max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = _headers(scope)
        if "host" in headers and _host_name(headers["host"]) is None:
            await _plain(send, 403, "malformed Host header refused")
            return
        if self.access.token is None and _host_name(headers.get("host", "")) not in LOOPBACK_NAMES:
            await _plain(send, 421, "this view answers only to 127.0.0.1 or localhost")
            return
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        given = query.get("token", [None])[0]
        if given is not None and scope["method"] == "GET":
            if not self.access.act_ok(given):
                await _plain(send, 401, "wrong token")
                return
            rest = urlencode({k: v for k, v in query.items() if k != "token"}, doseq=True)
            cookie = f"{COOKIE}={given}; HttpOnly; SameSite=Strict; Path=/".encode()
            location = (scope["path"] + (f"?{rest}" if rest else "")).encode()
            if self.access.on_link is not None:
                self.access.on_link()
            await _plain(
                send, 303, "token accepted", [(b"set-cookie", cookie), (b"location", location)]
            )
            return
        # A notification's approve/deny link is its own credential (signed, one-time,
        # expiring: store/links.py); its receiver has no token. Origin and size still apply.
        signed_link = scope["path"].startswith("/link/")
        if not signed_link and not self.access.token_ok(_offered_token(headers)):
            await _plain(
                send,
                401,
                "a token is needed: open /?token=TOKEN or send Authorization: Bearer TOKEN",
            )
            return
        if scope["method"] not in ("GET", "HEAD"):
            if not signed_link and not self.access.act_ok(_offered_token(headers)):
                await _plain(
                    send,
                    401,
                    "acting on a run takes the key in the link `durable-agent ui` printed: "
                    "open that link once (it sets a cookie), then act",
                )
                return
            origin = headers.get("origin")
            # "null" is what a sandboxed iframe, a data: page or a file sends: not our page.
            if origin == "null":
                await _plain(send, 403, "a request with Origin: null is refused")
                return
            if origin is not None and urlsplit(origin).netloc != headers.get("host"):
                await _plain(send, 403, "cross-origin request refused")
                return
            declared = headers.get("content-length")
            if declared is not None and (not declared.isdigit() or int(declared) > self.max_body):
                await _plain(send, 413, f"request body over {self.max_body} bytes")
                return
            receive = self._limited(receive)

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *HEADERS]
            await send(message)

        await self.app(scope, receive, send_with_headers)

    def _limited(self, receive: Receive) -> Receive:
        """A body sent in chunks without a length is cut off at the limit too."""
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_body:
                    raise BodyTooLarge
            return message

        return limited


class BodyTooLarge(Exception):
    """Raised from receive(); the app answers 413."""
