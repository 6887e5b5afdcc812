"""Odd requests to a real `durable-agent ui` process get clean answers: a POST with
`Origin: null` and a Host that only looks like loopback are refused (403), step numbers
beyond 64 bits (or beyond Python's digit limit, or not ASCII) are a 404, never a 500."""

from __future__ import annotations

import pytest
from ui_support import csrf_of, make_runs, open_store, printed_link, start_ui, stop


@pytest.mark.slow  # a real server process
def test_origin_null_and_a_host_that_only_looks_like_loopback_are_refused(  # type: ignore[no-untyped-def]
    cli, write_script, env, tmp_path
) -> None:
    import httpx

    url = env["DURABLE_AGENT_DB"]
    make_runs(cli, write_script, url)
    proc, address = start_ui(env, url, log=tmp_path / "ui.log")
    try:
        with httpx.Client(follow_redirects=True) as c:
            assert c.get(printed_link(tmp_path / "ui.log")).status_code == 200  # may act now
            csrf = csrf_of(c.get(address + "runs/wait").text)
            null = c.post(
                address + "runs/wait/approve",
                data={"csrf": csrf, "by": "mallory"},
                headers={"Origin": "null"},
                follow_redirects=False,
            )
            assert null.status_code == 403 and "Origin: null" in null.text, null.text
            assert open_store(url).get_run("wait").status == "blocked"
            port = address.rsplit(":", 1)[1].strip("/")
            for host in (f"localhost:{port}@evil.example", "localhost:1@evil.example", "a b"):
                odd = c.get(address, headers={"Host": host})
                assert odd.status_code == 403 and "Host" in odd.text, (host, odd.text)
            assert c.get(address, headers={"Host": f"localhost:{port}"}).status_code == 200
    finally:
        stop(proc)


@pytest.mark.slow  # a real server process
def test_step_numbers_beyond_64_bits_are_a_404_not_a_500(  # type: ignore[no-untyped-def]
    cli, write_script, env, tmp_path
) -> None:
    import httpx

    url = env["DURABLE_AGENT_DB"]
    make_runs(cli, write_script, url)
    proc, address = start_ui(env, url, log=tmp_path / "ui.log")
    try:
        with httpx.Client(follow_redirects=True) as c:
            for seq in ("18446744073709551616", "9223372036854775808", "9" * 5000):
                for tail in ("", "/diff"):
                    r = c.get(f"{address}runs/done/steps/{seq}{tail}")
                    assert r.status_code == 404, (seq[:30], tail, r.status_code, r.text[:200])
            assert c.get(f"{address}runs/done/steps/1").status_code == 200
            for first in ("18446744073709551616", "9" * 5000, "²"):
                r = c.get(f"{address}api/runs/done/steps", params={"from": first, "limit": first})
                assert r.status_code == 200, (first[:30], r.status_code, r.text[:200])
                r = c.get(address, params={"limit": first})
                assert r.status_code == 200, (first[:30], r.status_code, r.text[:200])
    finally:
        stop(proc)


def test_a_nul_in_a_run_id_or_a_search_is_a_404_or_no_match_on_either_store(store_url) -> None:  # type: ignore[no-untyped-def]
    """PostgreSQL refuses NUL in a text parameter; the view said the store was unavailable
    (503) for `/runs/a%00b` or `?q=%00`. A run id with NUL names no run (404, as on
    SQLite); a search with one finds the text as the store keeps it (NUL written `\\x00`)."""
    from ui_support import blocked_run, client

    blocked_run(store_url, "here")
    store = open_store(store_url)
    from durable_agent.messages import Message

    store.create_run(
        "nul",
        task="a\x00b",
        workspace="/w",
        model="m",
        settings={},
        first_messages=[Message("user", "t")],
    )
    c = client(store_url)
    csrf = csrf_of(c.get("/runs/here").text)
    for path in (
        "/runs/a%00b",
        "/runs/a%00b/steps/1",
        "/runs/a%00b/steps/1/diff",
        "/api/runs/a%00b",
        "/api/runs/a%00b/steps",
        "/api/runs/a%00b/events",
    ):
        r = c.get(path)
        assert r.status_code == 404, (path, r.status_code, r.text[:200])
    assert "no run" in c.get("/api/runs/a%00b").json()["error"]
    for action in ("approve", "deny", "cancel", "resume", "continue"):
        r = c.post(f"/runs/a%00b/{action}", data={"csrf": csrf, "message": "m"})
        assert r.status_code == 404, (action, r.status_code, r.text[:200])
    for q in ("\x00", "a\x00b"):
        found = c.get("/api/runs", params={"q": q})
        assert found.status_code == 200, found.text
        assert [r["id"] for r in found.json()["runs"]] == ["nul"]
        assert c.get("/", params={"q": q}).status_code == 200
    import base64

    forged = base64.urlsafe_b64encode(b"2099-01-01T00:00:00|a\x00").decode().rstrip("=")
    paged = c.get("/api/runs", params={"after": forged})  # a cursor not ours: page 1
    assert paged.status_code == 200 and len(paged.json()["runs"]) == 2, paged.text
