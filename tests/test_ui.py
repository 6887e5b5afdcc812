"""`durable-agent ui` over HTTP (Starlette's TestClient, and one real uvicorn process), on
SQLite and PostgreSQL: every route, the JSON API against `show --json`, the actions
recorded as the CLI records them, and the refusals (no token, wrong host, no CSRF)."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

import pytest
from scale_helpers import Workers, wait_for
from side_effects_support import ledger_lines
from ui_support import (
    answered_meanwhile,
    blocked_run,
    client,
    csrf_of,
    make_runs,
    open_store,
    printed_link,
    start_ui,
    stop,
)

from durable_agent.messages import Message  # noqa: E402

pytest.importorskip("starlette", reason="the `ui` extra is not installed")

FIRST = [Message("user", "t")]


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_every_page_and_api_route(cli, write_script, store_url) -> None:  # type: ignore[no-untyped-def]
    make_runs(cli, write_script, store_url)
    c = client(store_url)
    page = c.get("/")
    assert (
        page.status_code == 200
        and 'href="/runs/done"' in page.text
        and 'href="/runs/wait"' in page.text
    )
    assert (
        "<script>alert" not in page.text and "finish &lt;it&gt;" in page.text
    )  # stored text is escaped
    blocked = c.get("/", params={"status": "blocked"}).text
    assert 'href="/runs/wait"' in blocked and 'href="/runs/done"' not in blocked
    found = c.get("/", params={"q": "NEEDS a"}).text
    assert 'href="/runs/wait"' in found and 'href="/runs/done"' not in found
    assert c.get("/", params={"status": "nope"}).status_code == 400

    run = c.get("/runs/done")
    assert run.status_code == 200 and 'id="timeline"' in run.text
    steps = open_store(store_url).steps("done")
    assert (
        run.text.count('<rect class="mark') == len(steps) == run.text.count('<details class="step"')
    )
    assert "<script>alert(1)" not in run.text and "done &lt;script&gt;alert(1)" in run.text
    assert (
        all(f"k-{k}" in run.text for k in ("model",))
        and "e-write" in run.text
        and "e-exec" in run.text
    )
    waiting = c.get("/runs/wait").text
    assert 'id="approve-button"' in waiting and "touch made.txt" in waiting

    shown = cli("show", "done", "--json", extra_env={"DURABLE_AGENT_DB": store_url})
    assert c.get("/api/runs/done").json() == json.loads(
        shown.stdout
    )  # the same document as the CLI's
    assert c.get("/api/runs/done/steps").json() == json.loads(shown.stdout)["steps"]
    assert [s["seq"] for s in c.get("/api/runs/done/steps", params={"from": 2}).json()] == [
        s.seq for s in steps if s.seq >= 2
    ]
    listed = c.get("/api/runs").json()
    cli_list = json.loads(cli("list", "--json", extra_env={"DURABLE_AGENT_DB": store_url}).stdout)
    assert listed == {"runs": cli_list, "next": None}

    events = c.get("/api/runs/done/events")  # a finished run: one update, then the end
    assert events.status_code == 200 and events.headers["content-type"].startswith(
        "text/event-stream"
    )
    update = _events(events.text)
    assert [name for name, _ in update] == ["update", "end"]
    assert update[0][1]["count"] == len(steps) and update[0][1]["status"] == "completed"
    assert update[0][1]["chart"].count('<rect class="mark') == len(steps)
    assert len(update[0][1]["steps"]) == len(steps)
    later = _events(c.get("/api/runs/done/events", params={"from": len(steps)}).text)
    assert later[0][1]["steps"] == []  # the page has them all already

    body = c.get("/runs/done/steps/1")  # a step's body, as long pages fetch it when it is opened
    assert body.status_code == 200 and "<h4>input</h4>" in body.text and "a.txt" in body.text
    assert "<dt>attempts</dt><dd>1</dd>" in body.text and "<dt>duration</dt>" in body.text
    assert (
        c.get("/runs/done/steps/999").status_code == 404
        and c.get("/runs/nope/steps/0").status_code == 404
    )
    assert [
        s["seq"] for s in c.get("/api/runs/done/steps", params={"from": 1, "limit": 1}).json()
    ] == [1]
    write = next(
        s for s in steps if s.tool_name == "write_file"
    )  # the step's diff, from its snapshots
    diff = c.get(f"/runs/done/steps/{write.seq}/diff")
    assert diff.status_code == 200 and diff.headers["content-type"].startswith("text/plain")
    assert "+<b>hi</b>" in diff.text and "a.txt" in diff.text
    assert (
        f'href="/runs/done/steps/{write.seq}/diff"' in c.get(f"/runs/done/steps/{write.seq}").text
    )
    assert c.get("/runs/done/steps/0/diff").text == ""  # a model call changes no files
    assert c.get("/runs/done/steps/999/diff").status_code == 404
    assert c.get("/static/ui.js").status_code == 200 and c.get("/static/ui.css").status_code == 200
    for missing in (
        "/runs/nope",
        "/api/runs/nope",
        "/api/runs/nope/steps",
        "/api/runs/nope/events",
    ):
        assert c.get(missing).status_code == 404, missing
    assert "nope" in c.get("/api/runs/nope").json()["error"]


def _events(text: str) -> list[tuple[str, Any]]:
    out = []
    for block in text.split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "event" in lines:
            out.append((lines["event"], json.loads(lines["data"])))
    return out


def test_keyset_pages_visit_every_run_once_in_order_even_with_equal_times(store_url) -> None:  # type: ignore[no-untyped-def]
    store = open_store(store_url)
    for i in range(23):
        store.create_run(
            f"r{i:02d}",
            task=f"task {i}",
            workspace="/w",
            model="m",
            settings={},
            first_messages=FIRST,
        )
    with store.engine.begin() as conn:  # ties on created_at: the id decides, and no row is lost
        from sqlalchemy import text

        conn.execute(
            text("UPDATE runs SET created_at = (SELECT min(created_at) FROM runs) WHERE id < 'r10'")
        )
    c = client(store_url)
    seen: list[str] = []
    after: str | None = None
    pages = 0
    while True:
        doc = c.get("/api/runs", params={"limit": 5, **({"after": after} if after else {})}).json()
        seen += [r["id"] for r in doc["runs"]]
        pages += 1
        after = doc["next"]
        if after is None:
            break
    assert (
        pages == 5
        and sorted(seen) == sorted(f"r{i:02d}" for i in range(23))
        and len(set(seen)) == 23
    )
    expected = [r.id for r in store.list_runs(limit=100)]
    assert seen == expected  # the CLI's order: newest first, then id
    html = c.get("/", params={"limit": 5}).text
    assert 'id="next-page"' in html
    assert (
        c.get("/api/runs", params={"after": "not-a-cursor"}).json()["runs"][0]["id"] == expected[0]
    )


@pytest.mark.slow  # a worker process executes the approved run
def test_approve_through_the_ui_is_recorded_like_the_cli_and_the_run_continues(
    cli, write_script, store_url, env, workspace, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    make_runs(cli, write_script, store_url)
    c = client(store_url)
    token = csrf_of(c.get("/runs/wait").text)
    assert c.post("/runs/wait/approve", data={"by": "alice"}).status_code == 403  # no CSRF token
    assert c.post("/runs/wait/approve", data={"csrf": "forged", "by": "alice"}).status_code == 403
    store = open_store(store_url)
    assert store.pending_approval("wait") is not None
    r = c.post("/runs/wait/approve", data={"csrf": token, "by": "alice"}, follow_redirects=False)
    here = store_url.startswith("sqlite")  # the rule (docs/ui.md): SQLite resumes in the view
    done = "approved-here" if here else "approved"
    assert r.status_code == 303 and r.headers["location"] == f"/runs/wait?done={done}"
    (decision,) = store.approvals("wait")
    assert (decision.decision, decision.decided_by) == ("approved", "ui:alice")
    page = c.get(r.headers["location"]).text
    if here:
        assert "resuming in the view&#x27;s process" in page, page
    else:
        assert store.get_run("wait").status == "pending"  # on the workers' queue
        assert "queued: a worker" in page
    again = c.post("/runs/wait/approve", data={"csrf": token})
    assert again.status_code == 409 and "no pending approval" in again.text

    if here:
        wait_for(lambda: store.get_run("wait").status == "completed", 120, "the view's resume")
    else:
        workers = Workers({**env, "DURABLE_AGENT_DB": store_url}, store_url, tmp_path / "logs")
        try:
            proc = workers.start("--once", "--poll", "0.1", "--quiet")
            assert proc.wait(timeout=120) == 0, workers.log(proc)
        finally:
            workers.kill_all()
    assert store.get_run("wait").status == "completed"
    assert (workspace / "made.txt").exists() and len(
        ledger_lines(workspace)
    ) == 1  # ran exactly once


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_deny_names_the_token_holder_when_the_form_names_nobody(
    cli, write_script, store_url
) -> None:  # type: ignore[no-untyped-def]
    make_runs(cli, write_script, store_url)
    secret = "s" * 20
    c = client(store_url, token=secret, user="token-holder")
    c.headers["Authorization"] = f"Bearer {secret}"
    r = c.post(
        "/runs/wait/deny", data={"csrf": csrf_of(c.get("/runs/wait").text)}, follow_redirects=False
    )
    assert r.status_code == 303
    (decision,) = open_store(store_url).approvals("wait")
    assert (decision.decision, decision.decided_by) == ("denied", "ui:token-holder")
    if store_url.startswith("sqlite"):  # the view resumes it: the model is told, and answers
        wait_for(
            lambda: open_store(store_url).get_run("wait").status == "completed", 120, "the resume"
        )
    else:
        assert open_store(store_url).get_run("wait").status == "pending"  # the workers' queue


def test_cancel_and_resume_through_the_ui(store_url) -> None:  # type: ignore[no-untyped-def]
    from durable_agent.store.leases import new_owner

    store = open_store(store_url)
    store.create_run(
        "live",
        task="t",
        workspace="/w",
        model="m",
        settings={},
        first_messages=FIRST,
        lease=(new_owner(), 60),
    )  # held by this (live) process: executing
    store.create_run(
        "queued", task="t", workspace="/w", model="m", settings={}, first_messages=FIRST
    )
    c = client(store_url)
    token = csrf_of(c.get("/runs/live").text)
    assert 'id="cancel-button"' in c.get("/runs/live").text
    assert (
        c.post("/runs/live/cancel", data={"csrf": token}, follow_redirects=False).status_code == 303
    )
    run = store.get_run("live")
    assert (run.status, run.cancel_requested) == ("running", True)  # it stops at its next boundary
    c.post("/runs/queued/cancel", data={"csrf": token})
    assert store.get_run("queued").status == "cancelled"
    assert 'id="resume-button"' in c.get("/runs/queued").text
    r = c.post("/runs/queued/resume", data={"csrf": token}, follow_redirects=False)
    assert r.status_code == 303 and r.headers["location"] == "/runs/queued?done=queued"
    assert store.get_run("queued").status == "pending"
    with store.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE runs SET status = 'completed' WHERE id = 'queued'"))
    refused = c.post("/runs/queued/resume", data={"csrf": token})
    assert refused.status_code == 409 and "nothing to resume" in refused.text
    assert c.post("/runs/nope/cancel", data={"csrf": token}).status_code == 404


def test_a_run_cancelled_while_the_view_resumes_it_stays_cancelled(store_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # The view checks the run, then queues it: a `durable-agent cancel` landing between
    # the two (here: while the view asks for the run's open question) is not undone.
    from durable_agent.store.runs import Store

    store = open_store(store_url)
    store.create_run("r", task="t", workspace="/w", model="m", settings={}, first_messages=FIRST)
    with store.engine.begin() as conn:
        from sqlalchemy import text

        conn.execute(text("UPDATE runs SET status = 'failed' WHERE id = 'r'"))
    asked = Store.pending_approval

    def cancelled_meanwhile(self: Store, run_id: str) -> Any:
        open_store(store_url).cancel(run_id)  # another process
        return asked(self, run_id)

    c = client(store_url)
    token = csrf_of(c.get("/runs/r").text)
    monkeypatch.setattr(Store, "pending_approval", cancelled_meanwhile)
    refused = c.post("/runs/r/resume", data={"csrf": token})
    assert refused.status_code == 409 and "it was not queued" in refused.text, refused.text
    assert store.get_run("r").status == "cancelled"


@pytest.mark.parametrize(
    "secret", ["t0ken-" + "x" * 20, "t0ken+/=~." + "x" * 20]
)  # every character --token takes
def test_token_host_origin_and_body_limits(store_url, secret) -> None:  # type: ignore[no-untyped-def]
    c = client(store_url, token=secret)
    for path in ("/", "/api/runs", "/static/ui.js", "/runs/x"):
        refused = c.get(path)
        assert refused.status_code == 401 and "token" in refused.text, path
    assert c.get("/", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert c.get("/api/runs", headers={"Authorization": f"Bearer {secret}"}).status_code == 200
    assert c.get("/", params={"token": "wrong"}).status_code == 401
    r = c.get("/", params={"token": secret, "status": "blocked"}, follow_redirects=False)
    assert (
        r.status_code == 303 and r.headers["location"] == "/?status=blocked"
    )  # the token leaves the address
    assert "HttpOnly" in r.headers["set-cookie"] and "SameSite=Strict" in r.headers["set-cookie"]
    page = c.get("/")  # the cookie now carries it
    assert page.status_code == 200 and "access-control-allow-origin" not in page.headers
    # Among other apps' cookies on localhost, as a browser sends them all to every port: a
    # bare name, a space, JSON made the whole header unreadable (401 on every page).
    fresh = client(store_url, token=secret)
    for others in ("flag", "theme=dark mode", 'json={"a":1}', "back=sl\\ash"):
        cookies = f"{others}; durable_agent_token={secret}; later=1"
        assert fresh.get("/", headers={"Cookie": cookies}).status_code == 200, others
    assert (
        page.headers["x-frame-options"] == "DENY"
        and "default-src 'self'" in page.headers["content-security-policy"]
    )

    open_view = client(store_url)  # no token: loopback names only (no DNS rebinding)
    assert open_view.get("/", headers={"Host": "evil.example:8765"}).status_code == 421
    assert open_view.get("/", headers={"Host": "localhost:8765"}).status_code == 200
    token = csrf_of(open_view.get("/").text)
    cross = open_view.post(
        "/runs/x/cancel", data={"csrf": token}, headers={"Origin": "http://evil.example"}
    )
    assert cross.status_code == 403
    big = open_view.post(
        "/runs/x/cancel",
        content=b"csrf=" + b"a" * 100_000,
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert big.status_code == 413

    def chunks() -> Any:
        yield b"csrf=" + b"a" * 10_000
        yield b"a" * 10_000

    streamed = open_view.post(
        "/runs/x/cancel",
        content=chunks(),
        headers={"content-type": "application/x-www-form-urlencoded"},
    )
    assert streamed.status_code == 413


def test_cli_refuses_an_open_address_without_a_token_and_a_missing_extra(
    cli_inproc, monkeypatch
) -> None:  # type: ignore[no-untyped-def]
    r = cli_inproc("ui", "--host", "0.0.0.0")
    assert r.code == 2 and r.stderr.count("\n") == 1 and "without --token" in r.stderr
    r = cli_inproc("ui", "--host", "0.0.0.0", "--token", "short")
    assert r.code == 2 and "at least 16 characters" in r.stderr
    for odd in (
        "with space" * 2,
        "semi;colon" * 2,
        "hash#ampersand&" * 2,
        "é" * 16,
        "line\nbreak" * 2,
    ):
        r = cli_inproc(
            "ui", "--host", "0.0.0.0", "--token", odd
        )  # a cookie or a link would change it
        assert r.code == 2 and r.stderr.count("\n") == 1 and "may hold only" in r.stderr, odd
    r = cli_inproc("ui", "--port", "70000")
    assert r.code == 2 and "--port" in r.stderr

    import sys

    from durable_agent.errors import ConfigError
    from durable_agent.ui.serve import require_extra

    monkeypatch.setitem(sys.modules, "uvicorn", None)
    with pytest.raises(ConfigError, match=r"pip install 'durable-agent\[ui\]'"):
        require_extra()
    r = cli_inproc("ui")  # the command itself: one line naming the extra, no traceback
    assert (
        r.code == 2 and r.stderr.count("\n") == 1 and "pip install 'durable-agent[ui]'" in r.stderr
    ), r.stderr


@pytest.mark.slow  # a real server process
def test_a_real_uvicorn_process_serves_the_store_with_a_token(
    cli, write_script, store_url, env, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    import httpx

    make_runs(cli, write_script, store_url)
    secret = "real-token-" + "y" * 16
    proc, url = start_ui(env, store_url, "--token", secret, log=tmp_path / "ui.log")
    try:
        assert httpx.get(url).status_code == 401
        auth = {"Authorization": f"Bearer {secret}"}
        assert 'href="/runs/done"' in httpx.get(url, headers=auth).text
        doc = httpx.get(url + "api/runs/done", headers=auth).json()
        assert doc["id"] == "done" and doc["status"] == "completed"
        with httpx.stream("GET", url + "api/runs/done/events", headers=auth) as events:
            body = "".join(events.iter_text())
        assert "event: update" in body and "event: end" in body
        page = httpx.get(url + "runs/wait", headers=auth).text
        r = httpx.post(
            url + "runs/wait/approve", headers=auth, data={"csrf": csrf_of(page), "by": "carol"}
        )
        assert r.status_code == 303
        assert open_store(store_url).approvals("wait")[0].decided_by == "ui:carol"
    finally:
        stop(proc)
    assert proc.returncode is not None


@pytest.mark.slow  # a real server process, and the resume it starts
def test_an_approval_in_the_real_view_completes_the_run_with_no_worker(
    cli, write_script, env, tmp_path, workspace
) -> None:  # type: ignore[no-untyped-def]
    """Approving once left the run `pending` for a worker nobody ran: the view resumes it."""
    import httpx

    store_url = f"sqlite:///{tmp_path / 'store.db'}"
    make_runs(cli, write_script, store_url)
    proc, url = start_ui(env, store_url, log=tmp_path / "ui.log")
    try:
        with httpx.Client(base_url=url) as web:
            web.get(printed_link(tmp_path / "ui.log"))  # the printed link: may act
            page = web.get("runs/wait").text
            assert "<code>run_command `touch made.txt;" in page  # the question names the tool
            r = web.post("runs/wait/approve", data={"csrf": csrf_of(page), "by": "dana"})
            assert r.status_code == 303 and r.headers["location"].endswith("done=approved-here")
            assert "resuming in the view&#x27;s process" in web.get(r.headers["location"]).text
            store = open_store(store_url)
            wait_for(lambda: store.get_run("wait").status == "completed", 120, "the resume")
            assert store.get_run("wait").answer == "made it"
            assert (workspace / "made.txt").exists() and len(ledger_lines(workspace)) == 1
            assert store.approvals("wait")[0].used_at is not None  # the approval, used once
    finally:
        stop(proc)


@pytest.mark.slow  # over 2 s on 2 cores: the full lane only
def test_a_forks_lineage_is_on_its_page_and_stays_there_after_a_live_update(
    cli, write_script, store_url, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    make_runs(cli, write_script, store_url)
    env = {"DURABLE_AGENT_DB": store_url}
    r = cli(
        "fork",
        "done",
        "--at",
        "1",
        "--workspace",
        str(tmp_path / "forked"),
        "--run-id",
        "fk",
        extra_env=env,
    )
    assert r.code == 0, r.stderr
    assert (
        cli("cancel", "fk", extra_env=env).code == 0
    )  # stopped: its stream sends one update, then ends
    c = client(store_url)
    lineage = 'forked from</th><td><a href="/runs/done">done</a> after step 1'  # the seq `--at` took, as stored
    assert lineage in c.get("/runs/fk").text
    (update, _end) = _events(c.get("/api/runs/fk/events").text)
    assert (
        update[0] == "update" and lineage in update[1]["header"]
    )  # the page's header is replaced by this one
    assert "forked from" not in c.get("/runs/done").text


def _stand_in_browser(tmp_path: Path) -> tuple[Path, Path]:
    """A $BROWSER (as webbrowser reads it) that notes what it was given, the modes of the
    page and its folder, and the page's text."""
    opened, page = tmp_path / "opened.txt", tmp_path / "page.html"
    browser = tmp_path / "browser.sh"
    browser.write_text(
        f'#!/bin/sh\np="${{1#file://}}"\nstat -c %a "$p" "$(dirname "$p")" > {tmp_path}/modes\n'
        f'cat "$p" > {page}\necho "$1" >> {opened}\n'
    )
    browser.chmod(0o755)
    return browser, opened


@pytest.mark.slow  # real server processes, and a stand-in browser
def test_open_hands_the_browser_a_private_page_that_leads_on_with_the_token(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Not the link itself: any user can read a command line in /proc, and the link carries
    # what it takes to act on runs. Nor where a sandboxed command may read it: $TMPDIR, or a
    # runtime dir outside /run (bubblewrap replaces only /run and /tmp).
    import signal
    import tempfile
    import urllib.error
    import urllib.request

    browser, opened = _stand_in_browser(tmp_path)
    tmpdir, elsewhere = tmp_path / "tmpdir", tmp_path / "run"
    tmpdir.mkdir()
    elsewhere.mkdir(mode=0o700)
    secret = "open+token/=" + "z" * 16  # `+` and `/` must reach the view as they are
    quoted = "open%2Btoken%2F%3D" + "z" * 16
    base = {**env, "BROWSER": str(browser), "TMPDIR": str(tmpdir)}

    def opened_page(log: str, extra: dict[str, str], *flags: str) -> tuple[Any, str, Path]:
        opened.unlink(missing_ok=True)
        proc, url = start_ui(
            {**base, **extra}, env["DURABLE_AGENT_DB"], "--open", *flags, log=tmp_path / log
        )
        wait_for(
            lambda: opened.exists() and opened.read_text().endswith("\n"),
            20,
            "the browser to be opened",
        )
        (given,) = opened.read_text().splitlines()
        assert given.startswith("file:///") and secret not in given and "token" not in given
        return proc, url, Path(given.removeprefix("file://")).parent

    try:
        runtime = Path(tempfile.mkdtemp(dir="/run"))  # a runtime dir as systemd makes them
    except OSError:
        runtime = None
    if runtime is not None:
        try:
            proc, url, folder = opened_page(
                "ui1.log", {"XDG_RUNTIME_DIR": str(runtime)}, "--token", secret
            )
            try:
                assert folder.parent == runtime and folder.exists()
                assert (tmp_path / "modes").read_text().split() == ["600", "700"]  # the user's own
                assert (
                    f'content="0; url={url}?token={quoted}"' in (tmp_path / "page.html").read_text()
                )
                with contextlib.suppress(
                    urllib.error.HTTPError
                ):  # the redirect that sets the cookie
                    urllib.request.urlopen(f"{url}?token={quoted}", timeout=10)
                assert not folder.exists()  # the browser has followed it: the page is gone at once
            finally:
                stop(proc)
        finally:
            runtime.rmdir()

    # A runtime dir that is not under /run: /tmp instead. SIGTERM takes the page along.
    proc, url, folder = opened_page("ui2.log", {"XDG_RUNTIME_DIR": str(elsewhere)})
    assert folder.parent == Path("/tmp") and folder.exists()
    proc.terminate()
    assert proc.wait(timeout=10) == 143 and not folder.exists()

    # A closed terminal (SIGHUP): stopped as uvicorn stops, without a traceback, page gone.
    proc, url, folder = opened_page("ui3.log", {})
    proc.send_signal(signal.SIGHUP)
    assert proc.wait(timeout=10) == 129 and not folder.exists()
    assert "Traceback" not in (tmp_path / "ui3.log").read_text()
    assert list(tmpdir.iterdir()) == [] and list(elsewhere.iterdir()) == []


@pytest.mark.slow
def test_an_agents_command_with_the_network_on_cannot_act_through_the_view(
    cli, write_script, env, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # With the network on, a sandboxed command shares the loopback: it can read every page
    # of a view started without --token, the CSRF token in it included. Acting takes the key
    # in the link the view printed (in the person's terminal), which no page carries.
    from sandbox_support import need_bwrap

    need_bwrap()
    url = env["DURABLE_AGENT_DB"]
    make_runs(cli, write_script, url)
    proc, address = start_ui(env, url, log=tmp_path / "ui.log")
    try:
        attack = (
            "import re, urllib.request, urllib.parse, urllib.error as e\n"
            f"page = urllib.request.urlopen('{address}runs/wait').read().decode()\n"
            'csrf = re.search(\'data-csrf="([^"]+)"\', page).group(1)\n'
            "body = urllib.parse.urlencode({'csrf': csrf, 'by': 'mallory'}).encode()\n"
            "try:\n"
            f"    print('status', urllib.request.urlopen('{address}runs/wait/approve', body).status)\n"
            "except e.HTTPError as x:\n"
            "    print('status', x.code)\n"
        )
        script = write_script(
            [
                {
                    "tool_calls": [
                        {
                            "name": "run_command",
                            "arguments": {
                                "command": f"python3 -c \"$(cat <<'EOF'\n{attack}EOF\n)\""
                            },
                        }
                    ]
                },
                {"content": "tried"},
            ]
        )
        r = cli(
            "start",
            "t",
            "--model",
            script,
            "--shell",
            "allow",
            "--network",
            "on",
            "--run-id",
            "agent",
        )
        assert r.code == 0, r.stderr
        store = open_store(url)
        told = [m.content for m in store.messages("agent") if m.role == "tool"][0]
        assert "status 401" in told, told
        assert store.approvals("wait") == [] or store.approvals("wait")[0].decision is None
        assert store.get_run("wait").status == "blocked"
    finally:
        stop(proc)


@pytest.mark.slow  # real server processes
def test_a_second_signal_during_shut_down_ends_the_view_without_a_traceback(env, tmp_path) -> None:  # type: ignore[no-untyped-def]
    # Ctrl-C pressed again while SIGTERM's (or the first Ctrl-C's) shut-down ran cancelled
    # Starlette's lifespan with a traceback (3 runs in 30 with a 50-140 ms gap).
    import signal
    import time

    # (A first signal right after the address is printed, before uvicorn's handlers, raised
    # a KeyboardInterrupt into asyncio's start-up: a traceback, seen once in a CI run.)
    for i, (first, gap) in enumerate(
        [
            (signal.SIGTERM, 0.02),
            (signal.SIGINT, 0.05),
            (signal.SIGTERM, 0.08),
            (signal.SIGINT, 0.11),
            (signal.SIGTERM, 0.14),
            (signal.SIGINT, 0.03),
            (signal.SIGINT, 0.0),
            (signal.SIGTERM, 0.0),
        ]
    ):
        log = tmp_path / f"ui{i}.log"
        proc, _url = start_ui(env, env["DURABLE_AGENT_DB"], log=log)
        proc.send_signal(first)
        time.sleep(
            gap
        )  # the second signal lands somewhere in the shut-down, not to wait for anything
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=10)
        assert "Traceback" not in log.read_text(), (first, gap, log.read_text())


@pytest.mark.slow  # a real server process, a live event stream
def test_stopping_the_view_with_a_page_open_ends_its_stream_without_a_traceback(
    cli, write_script, env, tmp_path
) -> None:  # type: ignore[no-untyped-def]
    # A run page keeps an event stream open while its run is live; Ctrl-C then made uvicorn
    # wait out its graceful timeout and cancel the stream, with a traceback.
    import signal
    import threading
    import urllib.request

    url = env["DURABLE_AGENT_DB"]
    r = cli(
        "start",
        "t",
        "--model",
        write_script([{"content": "done"}]),
        "--run-id",
        "queued",
        "--detach",
    )
    assert r.code == 0, r.stderr  # pending, for a worker: its page stays live
    for sig in (signal.SIGINT, signal.SIGTERM):
        log = tmp_path / f"ui-{sig}.log"
        proc, address = start_ui(env, url, log=log)
        opened = threading.Event()
        read: list[bytes] = []

        def listen(
            address: str = address, opened: threading.Event = opened, read: list[bytes] = read
        ) -> None:
            with urllib.request.urlopen(f"{address}api/runs/queued/events", timeout=30) as stream:
                read.append(stream.readline())
                opened.set()
                read.append(stream.read())  # until the server ends it

        reader = threading.Thread(target=listen, daemon=True)
        reader.start()
        assert opened.wait(20), log.read_text()
        proc.send_signal(sig)
        proc.wait(timeout=15)
        reader.join(15)
        text = log.read_text()
        assert "Traceback" not in text and "graceful shutdown exceeded" not in text, text


def test_a_form_decision_racing_a_link_is_refused_not_written_over(store_url, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    """A link answers the question between the form's look and its write: the form is told
    (409) and the link's decision stays, as one-time promises; nothing is resumed twice."""
    blocked_run(store_url, "race")
    c = client(store_url)
    token = csrf_of(c.get("/runs/race").text)
    answered_meanwhile(monkeypatch, store_url, approved=True)
    r = c.post("/runs/race/deny", data={"csrf": token, "by": "bob"}, follow_redirects=False)
    assert r.status_code == 409 and "already" in r.text, r.text
    (decision,) = open_store(store_url).approvals("race")
    assert (decision.decision, decision.decided_by) == ("approved", "ui:link")
    assert open_store(store_url).get_run("race").status == "blocked"  # the link's own page goes on


def test_an_answer_from_a_stale_page_of_a_run_that_moved_on_is_refused(store_url) -> None:  # type: ignore[no-untyped-def]
    """The page showed the question, then the run was cancelled: its approve is refused
    (409, naming the run's state) rather than recorded with a notice of a resume that
    never happens."""
    blocked_run(store_url, "moved")
    c = client(store_url)
    token = csrf_of(c.get("/runs/moved").text)
    store = open_store(store_url)
    assert store.cancel("moved") == "cancelled"
    r = c.post("/runs/moved/approve", data={"csrf": token}, follow_redirects=False)
    assert r.status_code == 409 and "cancelled" in r.text, r.text
    assert store.approvals("moved")[0].decision is None
    assert store.get_run("moved").status == "cancelled"
