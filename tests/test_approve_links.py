"""Approve from a link: a `blocked` notification carries signed one-time approve/deny links
to the web view (`ui --public-url`); the decision is recorded as any approval is, and the
view continues the run itself (SQLite). A used, expired or tampered link is refused with a
page that says so. Over HTTP here, and in headless Chromium (test_a_link_in_the_browser)."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from scale_helpers import wait_for
from ui_support import BLOCKED_SCRIPT, open_store, start_ui, stop
from webhook_receiver import Receiver

from durable_agent.store.links import LinkClaim, make_token, read_token

FAST = {
    "notify_timeout_s": 2.0,
    "notify_retry_attempts": 3,
    "notify_retry_initial_wait_s": 0.01,
    "notify_retry_max_wait_s": 0.02,
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Setup:
    def __init__(self, env: dict[str, str], tmp_path: Path, receiver: Receiver) -> None:
        self.url = env["DURABLE_AGENT_DB"]
        config = tmp_path / "notify.toml"
        lines = [f"{k} = {json.dumps(v)}" for k, v in FAST.items()]
        lines += ["[[notify]]", f"url = {json.dumps(receiver.url)}"]
        lines += ['events = ["blocked", "completed"]']
        config.write_text("\n".join(lines) + "\n")
        self.env = {**env, "DURABLE_AGENT_CONFIG": str(config)}
        self.port = _free_port()
        self.public = f"http://127.0.0.1:{self.port}/"
        self.proc, self.address = start_ui(
            self.env,
            self.url,
            "--port",
            str(self.port),
            "--public-url",
            self.public,
            log=tmp_path / "ui.log",
        )
        self.receiver = receiver

    def blocked_links(self) -> dict[str, str]:
        events = [e for e in self.receiver.events().values() if e["event"] == "blocked"]
        (event,) = events
        (approval,) = event["approvals"]
        return dict(approval["links"])


@pytest.fixture
def setup(env: dict[str, str], tmp_path: Path) -> Iterator[Setup]:
    receiver = Receiver()
    s = Setup(env, tmp_path, receiver)
    yield s
    stop(s.proc)
    receiver.close()


def _block(cli: Any, write_script: Any, setup: Setup, run_id: str = "wait") -> dict[str, str]:
    r = cli(
        "start",
        "needs a person",
        "--model",
        write_script(BLOCKED_SCRIPT),
        "--run-id",
        run_id,
        "--quiet",
        extra_env={"DURABLE_AGENT_CONFIG": setup.env["DURABLE_AGENT_CONFIG"]},
    )
    assert r.code == 5, r.stderr
    links = setup.blocked_links()
    assert set(links) == {"approve", "deny"}
    assert all(link.startswith(setup.public + "link/") for link in links.values())
    return links


@pytest.mark.slow
def test_a_link_approves_once_and_the_view_continues_the_run(
    cli: Any, write_script: Any, setup: Setup, workspace: Path
) -> None:
    import httpx

    links = _block(cli, write_script, setup)
    page = httpx.get(links["approve"])  # shows the question; a GET decides nothing
    assert page.status_code == 200 and "Approve" in page.text and 'method="post"' in page.text
    store = open_store(setup.url)
    assert store.approvals("wait")[0].decision is None
    done = httpx.post(links["approve"])
    assert done.status_code == 200 and "resuming in the view" in done.text, done.text
    (approval,) = store.approvals("wait")
    assert (approval.decision, approval.decided_by) == ("approved", "ui:link")
    wait_for(lambda: store.get_run("wait").status == "completed", 60, "the run to finish")
    assert store.get_run("wait").answer == "made it"
    # Used: both the link and its twin are refused, saying so.
    for link in links.values():
        again = httpx.post(link)
        assert again.status_code == 409 and "already used" in again.text
        assert httpx.get(link).status_code == 409
    # The run's end after the approval is notified too.
    wait_for(
        lambda: any(e["event"] == "completed" for e in setup.receiver.events().values()),
        30,
        "the completed notification",
    )


def test_expired_and_tampered_links_are_refused_with_a_page_saying_so(
    cli: Any, write_script: Any, setup: Setup, sql: Any
) -> None:
    import httpx

    links = _block(cli, write_script, setup)
    token = links["deny"].rsplit("/", 1)[1]
    (key,) = sql("SELECT secret FROM web_links")[0]
    claim = read_token(key, token)
    assert isinstance(claim, LinkClaim) and claim.decision == "denied"
    expired = make_token(
        key, LinkClaim(claim.run_id, claim.approval_id, "denied", int(time.time()) - 1)
    )
    r = httpx.post(setup.public + "link/" + expired)
    assert r.status_code == 410 and "expired" in r.text
    body, _, mac = token.partition(".")
    flipped = body + "." + ("A" if mac[0] != "A" else "B") + mac[1:]
    for bad in (flipped, "x" + token, claim_approved_with_deny_mac(token)):
        r = httpx.post(setup.public + "link/" + bad)
        assert r.status_code == 403 and "not valid" in r.text, bad
    assert open_store(setup.url).approvals("wait")[0].decision is None  # nothing decided
    assert open_store(setup.url).get_run("wait").status == "blocked"


def claim_approved_with_deny_mac(token: str) -> str:
    """The deny link's signature on a body that says `approved`: a forged decision."""
    import base64

    body, _, mac = token.partition(".")
    data = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    data["d"] = "approved"
    forged = base64.urlsafe_b64encode(json.dumps(data, separators=(",", ":")).encode())
    return forged.rstrip(b"=").decode() + "." + mac


def test_public_url_must_be_an_http_address(cli: Any) -> None:
    r = cli("ui", "--public-url", "ftp://x")
    assert r.code == 2 and "--public-url" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_a_link_in_the_browser(cli: Any, write_script: Any, setup: Setup, sql: Any) -> None:
    from test_ui_browser import CHROMIUM, _missing

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("playwright is not installed (pip install -e '.[dev]')")
    if not Path(CHROMIUM).exists():
        _missing(f"chromium is not installed at {CHROMIUM} (apt-get install chromium)")
    links = _block(cli, write_script, setup)
    (key,) = sql("SELECT secret FROM web_links")[0]
    claim = read_token(key, links["approve"].rsplit("/", 1)[1])
    assert isinstance(claim, LinkClaim)
    expired = (
        setup.public
        + "link/"
        + make_token(
            key, LinkClaim(claim.run_id, claim.approval_id, "approved", int(time.time()) - 1)
        )
    )
    tampered = links["approve"][:-3] + ("xyz" if not links["approve"].endswith("xyz") else "abc")
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"]
        )
        try:
            page = browser.new_context().new_page()
            page.goto(expired)
            assert "expired" in page.locator("p.refused").inner_text()
            page.goto(tampered)
            assert "not valid" in page.locator("p.refused").inner_text()
            page.goto(links["approve"])  # valid: the question, one button
            assert "Approve" in page.locator("h1").inner_text()
            page.click("#decide")
            page.wait_for_selector("p.notice")
            assert "approved" in page.locator("p.notice").inner_text()
            page.goto(links["approve"])  # reused
            assert "already used" in page.locator("p.refused").inner_text()
            page.goto(links["deny"])  # its twin too
            assert "already used" in page.locator("p.refused").inner_text()
        finally:
            browser.close()
    store = open_store(setup.url)
    wait_for(lambda: store.get_run("wait").status == "completed", 60, "the run to finish")
    assert [(a.decision, a.decided_by) for a in store.approvals("wait")] == [
        ("approved", "ui:link")
    ]


def _link_client(url: str, key: str, token: str | None = None) -> Any:
    from starlette.testclient import TestClient

    from durable_agent.ui.app import UiConfig, build_app
    from durable_agent.ui.security import Access

    app = build_app(
        UiConfig(store=open_store(url), access=Access(token=token), user="u", link_key=key)
    )
    return TestClient(app, base_url="http://127.0.0.1:8765")


def test_a_link_to_a_run_that_moved_on_is_refused_and_decides_nothing(env: dict[str, str]) -> None:
    """The run was cancelled after its notification: the link's question no longer stops
    it, so the link is refused (409) with the run's state, rather than recording an answer
    and saying the run was queued when nothing was."""
    from ui_support import blocked_run

    from durable_agent.store.links import approval_links

    url, key = env["DURABLE_AGENT_DB"], "ab" * 32
    approval = blocked_run(url, "moved")
    links = approval_links("http://127.0.0.1:8765", key, "moved", approval, 600)
    store = open_store(url)
    assert store.cancel("moved") == "cancelled"
    c = _link_client(url, key)
    for method in ("GET", "POST"):
        r = c.request(method, links["approve"])
        assert r.status_code == 409 and "cancelled" in r.text and "queued" not in r.text, r.text
        assert 'method="post"' not in r.text
    assert store.approvals("moved")[0].decision is None
    assert store.get_run("moved").status == "cancelled"


def test_a_link_page_holds_no_csrf_token_of_the_view(env: dict[str, str]) -> None:
    """A link needs no view token, so whoever holds one (a chat channel) reads its pages:
    they carry no CSRF token of the view, which only the token's holders are to have."""
    import re

    from ui_support import blocked_run

    from durable_agent.store.links import approval_links

    url, key, token = env["DURABLE_AGENT_DB"], "cd" * 32, "t" * 24
    approval = blocked_run(url, "asked")
    links = approval_links("http://127.0.0.1:8765", key, "asked", approval, 600)
    c = _link_client(url, key, token=token)
    owner = c.get("/runs/asked", headers={"Authorization": f"Bearer {token}"}).text
    (csrf,) = re.findall(r'data-csrf="([^"]+)"', owner)
    for page in (
        c.get(links["deny"]),
        c.get("http://127.0.0.1:8765/link/not-a-token"),
        c.post(links["deny"]),
        c.post(links["deny"]),
    ):
        assert page.status_code in (200, 403, 409) and csrf not in page.text, page.text
