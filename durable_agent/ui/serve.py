"""`durable-agent ui`: check the address and the token, open the store, serve on uvicorn.

Imported only by that command; Starlette and uvicorn come with the `ui` extra, and their
absence is one line naming it."""

from __future__ import annotations

import functools
import getpass
import html
import ipaddress
import os
import re
import shutil
import signal
import socket
import stat
import sys
import tempfile
import threading
import webbrowser
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from msgspec import Struct

from durable_agent.errors import ConfigError

if TYPE_CHECKING:
    from durable_agent.store.runs import StoreSettings

TOKEN_ENV = "DURABLE_AGENT_UI_TOKEN"
MIN_TOKEN = 16
# What a Bearer token may hold (RFC 6750's b64token): the token goes in a header, a cookie
# and a link, and these characters pass through all three unchanged.
TOKEN_CHARACTERS = re.compile(r"[A-Za-z0-9._~+/=-]+")
PAGE_SECONDS = 120.0  # how long `--open`'s page waits for a browser slow to start


class ServeOptions(Struct, frozen=True):
    host: str
    port: int
    token: str | None
    open_browser: bool
    poll_s: float = 0.5
    public_url: str | None = None  # where notifications' receivers reach the view


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check(options: ServeOptions) -> None:
    """Refuse, in one line, what would expose the store: a non-loopback address without a
    token, a guessable token or one that a link, a cookie or a header would change, a port out
    of range."""
    if not 0 <= options.port <= 65535:
        raise ConfigError(f"--port must be 0 to 65535, not {options.port}")
    if options.token is not None and len(options.token) < MIN_TOKEN:
        raise ConfigError(
            f"--token must be at least {MIN_TOKEN} characters (e.g. `openssl rand -hex 16`)"
        )
    if options.token is not None and not TOKEN_CHARACTERS.fullmatch(options.token):
        raise ConfigError(
            "--token may hold only letters, digits and - . _ ~ + / = (as a Bearer token; "
            "e.g. `openssl rand -hex 16`)"
        )
    if options.public_url is not None:
        from urllib.parse import urlsplit

        parts = urlsplit(options.public_url)
        if parts.scheme not in ("http", "https") or not parts.hostname or parts.query:
            raise ConfigError(
                "--public-url must be the view's http:// or https:// address, e.g. "
                f"https://agent.example.com; got {options.public_url!r}"
            )
    if not is_loopback(options.host) and options.token is None:
        raise ConfigError(
            f"refusing to listen on {options.host} without --token: anyone who can reach it "
            f"could approve commands (keep the default --host 127.0.0.1, or set --token)"
        )


def require_extra() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError(
            "the web view needs the `ui` extra: pip install 'durable-agent[ui]'"
        ) from None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"


def serve(settings: StoreSettings, options: ServeOptions) -> int:
    check(options)
    require_extra()
    import uvicorn

    from durable_agent.live import channel_dir
    from durable_agent.store.location import store_key
    from durable_agent.store.runs import open_store
    from durable_agent.ui.app import UiConfig, build_app
    from durable_agent.ui.security import Access

    store = open_store(settings)
    from durable_agent.store.outbox import Outbox

    outbox = Outbox(store.engine, store.policy)
    # --public-url: recorded in the store, where the processes that write a `blocked`
    # notification find it and the key its approve/deny links are signed with.
    link_key = (
        outbox.set_public_url(options.public_url) if options.public_url else outbox.links()[1]
    )
    pages: list[Path] = []  # --open's page: gone once the link is used (or see _redirect_page)
    access = Access(token=options.token, on_link=lambda: _remove(pages))
    user = "token-holder" if options.token else _user()
    servers: list[Any] = []  # the one below, for the streams to see it stopping
    app = build_app(
        UiConfig(
            store=store,
            access=access,
            user=user,
            poll_s=options.poll_s,
            link_key=link_key,
            stopping=lambda: bool(servers and servers[0].should_exit),
            live_dir=channel_dir(
                store_key(store.engine.url.render_as_string(hide_password=False)), os.environ
            ),
        )
    )
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    try:
        sock = socket.create_server((options.host.strip("[]"), options.port), family=family)
    except OSError as exc:
        raise ConfigError(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}"
        ) from None
    port = sock.getsockname()[1]
    shown = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{shown}:{port}/"
    # The first line is the address (tests and scripts read it). A token given is not
    # printed back; without one, the link carries the key that acting takes (security.py).
    link = url + "?token=" + quote(access.link_secret, safe="")  # `+` would arrive as a space
    # No lifespan: the app has no start-up or shut-down work, and a second signal during
    # shut-down cancelled it with a traceback.
    config = uvicorn.Config(
        app,
        log_level="warning",
        server_header=False,
        date_header=False,
        proxy_headers=False,
        timeout_graceful_shutdown=2,
        lifespan="off",
    )
    server = uvicorn.Server(config)
    servers.append(server)
    # From before the address is printed (a script may signal as soon as it reads it) until
    # uvicorn's own handlers take over inside serve(), and when it raises again what they
    # caught, a signal asks the server to stop: a KeyboardInterrupt raised into asyncio's
    # start-up left a traceback. With --open, SIGHUP (a closed terminal) too, so that the
    # page goes with the view (`finally`).
    stopped: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM, *([signal.SIGHUP] if options.open_browser else [])):
        signal.signal(sig, functools.partial(_stop, server, stopped))
    print(
        f"durable-agent ui: {url if options.token else link} (Ctrl-C stops)",
        file=sys.stderr,
        flush=True,
    )
    try:
        if options.open_browser:
            _open_in_browser(link, pages)
        server.run(sockets=[sock])
    finally:
        _remove(pages)
    if stopped and stopped[0] == signal.SIGINT:
        raise KeyboardInterrupt  # as a Ctrl-C ends every command
    if stopped:
        raise SystemExit(128 + stopped[0])
    return 0


def _stop(server: Any, seen: list[int], signum: int, _frame: object) -> None:
    seen.append(signum)
    server.should_exit = True


def _open_in_browser(link: str, pages: list[Path]) -> None:
    page = _redirect_page(link)
    if page is None:
        return
    pages.append(page)
    for delay, action in (
        (0.5, lambda: webbrowser.open(page.as_uri()) if pages else None),
        (PAGE_SECONDS, lambda: _remove(pages)),
    ):
        timer = threading.Timer(delay, action)
        timer.daemon = True  # not after the view has stopped
        timer.start()


def _remove(pages: list[Path]) -> None:
    while True:
        try:
            page = pages.pop()
        except IndexError:  # (the link used as the timer ran out: both remove)
            return
        shutil.rmtree(page.parent, ignore_errors=True)


def _redirect_page(link: str) -> Path | None:
    """A page that sends the browser on to `link`, for the browser's command line instead of
    the link: any user on the machine can read a command line (/proc/PID/cmdline), and the
    link holds what acting on runs takes. The page is the user's own, in a private folder in
    $XDG_RUNTIME_DIR (under /run) or /tmp, never $TMPDIR: under bubblewrap commands see a
    private /run and /tmp, but the rest of the disk (under Landlock, all of it). It goes once the link is used, after PAGE_SECONDS, or
    when the view stops. None (said in one line) when it cannot be made: the link is printed."""
    try:
        folder = Path(tempfile.mkdtemp(prefix="durable-agent-ui-", dir=_private_base()))
        page = folder / "open.html"
        fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        print(
            f"durable-agent ui: cannot make the page --open hands the browser ({exc.strerror or exc}): "
            "open the link above",
            file=sys.stderr,
            flush=True,
        )
        return None
    target = html.escape(link, quote=True)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(
            f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={target}">'
            f'<title>durable-agent ui</title><a href="{target}">Open the durable-agent view</a>\n'
        )
    return page


def _private_base() -> str:
    """$XDG_RUNTIME_DIR when it is the user's own, closed to others, and under /run (which
    bubblewrap replaces for commands, as /tmp; WSL's lies elsewhere), else /tmp."""
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    real = os.path.realpath(runtime) if os.path.isabs(runtime) else ""
    try:
        st = os.stat(real) if real.startswith("/run/") else None
    except OSError:
        st = None
    if (
        st is not None
        and stat.S_ISDIR(st.st_mode)
        and st.st_uid == os.getuid()
        and not st.st_mode & 0o077
    ):
        return real
    return "/tmp"
