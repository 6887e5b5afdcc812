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
