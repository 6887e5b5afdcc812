"""`durable-agent ui`: check the address and the token, open the store, serve on uvicorn.

Imported only by that command; Starlette and uvicorn come with the `ui` extra, and their
absence is one line naming it."""

from __future__ import annotations

import getpass
import html
import ipaddress
import os
import shutil
import socket
import sys
import tempfile
import threading
import webbrowser
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from durable_agent.errors import ConfigError

if TYPE_CHECKING:
    from durable_agent.store.runs import StoreSettings

TOKEN_ENV = "DURABLE_AGENT_UI_TOKEN"
MIN_TOKEN = 16
PAGE_SECONDS = 120.0  # how long `--open`'s page stays for a browser slow to start


@dataclass(frozen=True)
class ServeOptions:
    host: str
    port: int
    token: str | None
    open_browser: bool
    poll_s: float = 0.5


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check(options: ServeOptions) -> None:
    """Refuse, in one line, what would expose the store: a non-loopback address without a
    token, a guessable token, a port out of range."""
    if not 0 <= options.port <= 65535:
        raise ConfigError(f"--port must be 0 to 65535, not {options.port}")
    if options.token is not None and len(options.token) < MIN_TOKEN:
        raise ConfigError(f"--token must be at least {MIN_TOKEN} characters (e.g. `openssl rand -hex 16`)")
    if not is_loopback(options.host) and options.token is None:
        raise ConfigError(f"refusing to listen on {options.host} without --token: anyone who can reach it "
                          f"could approve commands (keep the default --host 127.0.0.1, or set --token)")


def require_extra() -> None:
    try:
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError:
        raise ConfigError("the web view needs the `ui` extra: pip install 'durable-agent[ui]'") from None


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return "local"


def serve(settings: StoreSettings, options: ServeOptions) -> int:
    check(options)
    require_extra()
    import uvicorn

    from durable_agent.store.runs import open_store
    from durable_agent.ui.app import UiConfig, build_app
    from durable_agent.ui.security import Access

    store = open_store(settings)
    access = Access(token=options.token)
    user = "token-holder" if options.token else _user()
    app = build_app(UiConfig(store=store, access=access, user=user, poll_s=options.poll_s))
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    try:
        sock = socket.create_server((options.host.strip("[]"), options.port), family=family)
    except OSError as exc:
        raise ConfigError(f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc}") from None
    port = sock.getsockname()[1]
    shown = f"[{options.host}]" if ":" in options.host else options.host
    url = f"http://{shown}:{port}/"
    # The first line is the address (tests and scripts read it). A token given is not
    # printed back; without one, the link carries the key that acting takes (security.py).
    link = url + f"?token={access.link_secret}"
    print(f"durable-agent ui: {url if options.token else link} (Ctrl-C stops)", file=sys.stderr, flush=True)
    page = _redirect_page(link) if options.open_browser else None
    if page is not None:
        threading.Timer(0.5, webbrowser.open, args=(page.as_uri(),)).start()
        gone = threading.Timer(PAGE_SECONDS, shutil.rmtree, args=(page.parent,), kwargs={"ignore_errors": True})
        gone.daemon = True
        gone.start()
    config = uvicorn.Config(app, log_level="warning", server_header=False, date_header=False,
                            proxy_headers=False, timeout_graceful_shutdown=2)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        if page is not None:
            shutil.rmtree(page.parent, ignore_errors=True)
    return 0


def _redirect_page(link: str) -> Path:
    """A page that sends the browser on to `link`, for the browser's command line instead of
    the link: any user on the machine can read a command line (/proc/PID/cmdline), and the
    link holds what acting on runs takes. The page is the user's own (a private folder;
    under bubblewrap, commands see a private /tmp) and goes once the browser has had time to
    read it, or when the view stops (a SIGTERM may leave it: its key died with the view)."""
    folder = Path(tempfile.mkdtemp(prefix="durable-agent-ui-"))
    page = folder / "open.html"
    fd = os.open(page, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    target = html.escape(link, quote=True)
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(f'<!doctype html><meta charset="utf-8"><meta http-equiv="refresh" content="0; url={target}">'
                f'<title>durable-agent ui</title><a href="{target}">Open the durable-agent view</a>\n')
    return page
