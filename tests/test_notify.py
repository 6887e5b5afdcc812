"""Notifications sent exactly once per event: the outbox row is committed with the run's
end, a deliverer posts it (Idempotency-Key, HMAC-SHA256 signature), retries, marks it; a
process killed anywhere between the commit and the mark leaves it for a later deliverer,
which sends it under the same key. The receiver here counts keys as a deduplicating
receiver would, and checks every signature."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from webhook_receiver import Receiver

SECRET = "whsec-test-0123456789"
FAST = {
    "notify_timeout_s": 2.0,
    "notify_retry_attempts": 3,
    "notify_retry_initial_wait_s": 0.01,
    "notify_retry_max_wait_s": 0.02,
}
DONE = [{"content": "done"}]


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(secret=SECRET)
    yield r
    r.close()


def config(tmp_path: Path, targets: list[dict[str, Any]], **extra: Any) -> dict[str, str]:
    lines = [f"{k} = {json.dumps(v)}" for k, v in {**FAST, **extra}.items()]
    for t in targets:
        lines.append("[[notify]]")
        lines += [f"{k} = {json.dumps(v)}" for k, v in t.items()]
    path = tmp_path / "notify.toml"
    path.write_text("\n".join(lines) + "\n")
    return {"DURABLE_AGENT_CONFIG": str(path)}


def hook(receiver: Receiver, **more: Any) -> dict[str, Any]:
    return {"url": receiver.url, "secret": SECRET, **more}


def test_a_run_end_is_posted_once_with_its_key_and_a_signature_that_verifies(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    sql: Callable[..., list[Any]],
) -> None:
    receiver = Receiver(fail_first=2, secret=SECRET)  # the first two attempts get a 503
    try:
        extra = config(tmp_path, [hook(receiver)])
        result = cli("start", "t", "--model", write_script(DONE), "--json", extra_env=extra)
        assert result.code == 0, result.stderr
        run_id = result.json()["run_id"]
        assert len(receiver.requests) == 3  # two refused, the third accepted
        keys = {r["headers"]["idempotency-key"] for r in receiver.requests}
        assert len(keys) == 1  # every retry under the same key
        assert all(receiver.verify(r) for r in receiver.requests)
        (event,) = receiver.events().values()
        assert (event["event"], event["run_id"], event["status"]) == (
            "completed",
            run_id,
            "completed",
        )
        assert event["idempotency_key"] in keys
        assert receiver.requests[0]["headers"]["x-durable-agent-event"] == "completed"
        rows = sql("SELECT event, attempts, delivered_at IS NOT NULL FROM notifications")
        assert rows == [("completed", 3, 1)]
        # A tampered body does not verify.
        forged = dict(
            receiver.requests[-1],
            body=receiver.requests[-1]["body"].replace(b"completed", b"failed"),
        )
        assert not receiver.verify(forged)
    finally:
        receiver.close()


def test_only_the_events_an_entry_asks_for_and_a_command_target(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    receiver: Receiver,
    workspace: Path,
) -> None:
    seen = tmp_path / "seen.jsonl"
    program = f"import sys, os; open({str(seen)!r}, 'a').write(os.environ['DURABLE_AGENT_EVENT'] + ' ' + sys.stdin.read() + '\\n')"
    extra = config(
        tmp_path,
        [
            hook(receiver, events=["failed"]),
            {"command": ["python3", "-c", program], "events": ["completed", "budget_exceeded"]},
        ],
    )
    many = [{"tool_calls": [{"name": "list_files", "arguments": {}}]}] * 3
    assert cli("start", "t", "--model", write_script(DONE), extra_env=extra).code == 0
    assert (
        cli("start", "t", "--model", write_script(many), "--max-steps", "1", extra_env=extra).code
        == 3
    )
    assert receiver.requests == []  # it wants only `failed`
    lines = seen.read_text().splitlines()
    assert [line.split(" ", 1)[0] for line in lines] == ["completed", "budget_exceeded"]
    assert json.loads(lines[1].split(" ", 1)[1])["stop_reason"] == "max_steps"


def _deliver_until_done(
    cli: Callable[..., Any], extra: dict[str, str], sql: Callable[..., list[Any]]
) -> None:
    """`notify deliver` until nothing is pending (a claim left by a killed process runs out
    after claim_seconds: short with the settings here)."""
    import time

    deadline = time.monotonic() + 30
    while sql("SELECT count(*) FROM notifications WHERE delivered_at IS NULL") != [(0,)]:
        assert time.monotonic() < deadline, sql("SELECT * FROM notifications")
        cli("notify", "deliver", extra_env=extra)
        time.sleep(0.1)  # a claim's expiry is a time in the store: wait for it, not for luck


@pytest.mark.slow
def test_killed_at_every_checkpoint_and_between_commit_and_post_each_end_arrives_once(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    receiver: Receiver,
    sql: Callable[..., list[Any]],
) -> None:
    # notify_timeout_s is short so that a claim a killed deliverer left runs out soon.
    extra = config(tmp_path, [hook(receiver)], notify_timeout_s=0.3)
    script = write_script([{"tool_calls": [{"name": "list_files", "arguments": {}}]}, *DONE])
    runs = []
    point = 1
    while True:  # SIGKILL at the k-th checkpoint boundary, for every k the run has
        crash = {**extra, "DURABLE_AGENT_CRASH_AFTER": str(point)}
        first = cli("start", "t", "--model", script, "--run-id", f"r{point}", extra_env=crash)
        runs.append(f"r{point}")
        if first.code != -9:
            assert first.code == 0, first.stderr
            break
        status = sql("SELECT status FROM runs WHERE id = ?", f"r{point}")[0][0]
        if status != "completed":  # killed before its end was committed: resume it
            assert cli("resume", f"r{point}", extra_env=extra).code == 0
        point += 1
    assert point > 3
    # Killed after the claim (nothing sent) and after the post (sent, not marked).
    for where in ("claimed", "posted"):
        crash = {**extra, "DURABLE_AGENT_NOTIFY_CRASH": where}
        run_id = f"n-{where}"
        assert cli("start", "t", "--model", script, "--run-id", run_id, extra_env=crash).code == -9
        runs.append(run_id)
    _deliver_until_done(cli, extra, sql)
    events = receiver.events()
    by_run: dict[str, list[str]] = {}
    for e in events.values():
        by_run.setdefault(e["run_id"], []).append(e["event"])
    assert by_run == {r: ["completed"] for r in runs}  # each end once, however it was killed
    posted = [r for r in receiver.requests if json.loads(r["body"])["run_id"] == "n-posted"]
    assert len(posted) == 2  # sent twice under one key: the receiver keeps it once
    assert len({r["headers"]["idempotency-key"] for r in posted}) == 1
    assert all(receiver.verify(r) for r in receiver.requests)


@pytest.mark.slow
def test_a_receiver_down_for_a_while_gets_every_event_from_a_worker_afterwards(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    receiver: Receiver,
    sql: Callable[..., list[Any]],
) -> None:
    extra = config(tmp_path, [hook(receiver)])
    receiver.down()
    for i in range(3):
        result = cli(
            "start", "t", "--model", write_script(DONE), "--run-id", f"d{i}", extra_env=extra
        )
        assert result.code == 0  # the run's exit code is the run's
        assert "notification not delivered yet" in result.stderr
    assert sql("SELECT count(*) FROM notifications WHERE delivered_at IS NULL") == [(3,)]
    receiver.up()  # back, on the same port
    result = cli("worker", "--once", "--poll", "0.05", extra_env=extra)
    assert result.code == 0, result.stderr
    assert sorted(e["run_id"] for e in receiver.events().values()) == ["d0", "d1", "d2"]
    assert len(receiver.requests) == 3
    assert sql("SELECT count(*) FROM notifications WHERE delivered_at IS NULL") == [(0,)]


def test_notify_test_sends_a_sample_and_bad_entries_are_one_line_errors(
    cli: Callable[..., Any], tmp_path: Path, receiver: Receiver
) -> None:
    extra = config(tmp_path, [hook(receiver)])
    result = cli("notify", "test", extra_env=extra)
    assert result.code == 0, result.stderr
    assert "delivered 1" in result.stdout
    (event,) = receiver.events().values()
    assert event["event"] == "test" and receiver.verify(receiver.requests[0])
    none = cli("notify", "test", extra_env=config(tmp_path, []))
    assert none.code == 2 and "[[notify]]" in none.stderr and "Traceback" not in none.stderr
    bad = config(tmp_path, [{"url": "ftp://x", "events": ["completed"]}])
    result = cli("notify", "test", extra_env=bad)
    assert result.code == 2 and "http" in result.stderr and "Traceback" not in result.stderr
    bad = config(tmp_path, [{"url": receiver.url, "events": ["finished"]}])
    result = cli("notify", "test", extra_env=bad)
    assert result.code == 2 and "events" in result.stderr


def test_notify_settings_are_not_recorded_on_the_run(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    receiver: Receiver,
    sql: Callable[..., list[Any]],
) -> None:
    extra = config(tmp_path, [hook(receiver)])
    assert cli("start", "t", "--model", write_script(DONE), extra_env=extra).code == 0
    (settings,) = sql("SELECT settings FROM runs")[0]
    assert not [k for k in json.loads(settings) if k.startswith("notify")]
    assert SECRET not in settings


@pytest.mark.slow  # over 2 s on 2 cores
def test_each_store_queues_and_delivers_an_end_once(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    store_url: str,
) -> None:
    """The outbox on both backends: a blocked run's event, then its completed one after the
    approval, each once, signed; nothing left pending."""
    from ui_support import BLOCKED_SCRIPT, open_store

    from durable_agent.store.outbox import Outbox

    receiver = Receiver(fail_first=1, secret=SECRET)
    try:
        extra = {**config(tmp_path, [hook(receiver, events=["blocked", "completed"])])}
        extra["DURABLE_AGENT_DB"] = store_url
        r = cli(
            "start", "t", "--model", write_script(BLOCKED_SCRIPT), "--run-id", "b", extra_env=extra
        )
        assert r.code == 5, r.stderr
        assert cli("approve", "b", extra_env=extra).code == 0
        assert cli("resume", "b", extra_env=extra).code == 0
        events = receiver.events()
        assert sorted(e["event"] for e in events.values()) == ["blocked", "completed"]
        (blocked,) = [e for e in events.values() if e["event"] == "blocked"]
        assert blocked["approvals"][0]["tool_name"] == "run_command"
        assert "links" not in blocked["approvals"][0]  # no view gave its address
        assert all(receiver.verify(req) for req in receiver.requests)
        rows = Outbox(open_store(store_url).engine).all()
        assert [(n.event, n.delivered_at is not None) for n in rows] == [
            ("blocked", True),
            ("completed", True),
        ]
    finally:
        receiver.close()


class _Hostile:
    """A receiver that answers every POST with `answer(handler)`; the paths it was asked."""

    def __init__(self, answer: Callable[[BaseHTTPRequestHandler], None]) -> None:
        self.asked: list[str] = []
        hostile = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                hostile.asked.append(f"POST {self.path}")
                answer(self)

            def do_GET(self) -> None:  # noqa: N802
                hostile.asked.append(f"GET {self.path}")
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def test_a_redirect_is_not_followed_and_the_event_stays_pending(
    cli: Callable[..., Any], tmp_path: Path, sql: Callable[..., list[Any]]
) -> None:
    # Followed, the POST became a GET of the other address (a cloud's metadata service,
    # say) with the key and signature and without the event, and its 200 marked it sent.
    elsewhere = _Hostile(lambda h: None)

    def moved(h: BaseHTTPRequestHandler) -> None:
        h.send_response(302)
        h.send_header("Location", elsewhere.url.replace("/hook", "/latest/meta-data/"))
        h.send_header("Content-Length", "0")
        h.end_headers()

    receiver = _Hostile(moved)
    try:
        result = cli("notify", "test", extra_env=config(tmp_path, [{"url": receiver.url}]))
        assert result.code != 0 and "HTTP 302" in result.stdout + result.stderr
        assert receiver.asked == ["POST /hook"] * FAST["notify_retry_attempts"]
        assert elsewhere.asked == []
        assert sql("SELECT count(*) FROM notifications WHERE delivered_at IS NULL") == [(1,)]
    finally:
        receiver.close()
        elsewhere.close()


def test_a_receiver_that_trickles_its_answer_does_not_hold_the_deliverer(
    cli: Callable[..., Any], tmp_path: Path, sql: Callable[..., list[Any]]
) -> None:
    # Each byte within notify_timeout_s of the last: reading the body never timed out.
    def trickle(h: BaseHTTPRequestHandler) -> None:
        h.send_response(200)
        h.send_header("Content-Length", str(1 << 30))
        h.end_headers()
        try:
            while True:
                h.wfile.write(b"x")
                h.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass  # the deliverer hung up

    receiver = _Hostile(trickle)
    try:
        extra = config(tmp_path, [{"url": receiver.url}])
        result = cli("notify", "test", extra_env=extra, timeout=60)
        assert result.code == 0, result.stderr
        assert receiver.asked == ["POST /hook"]
        assert sql("SELECT count(*) FROM notifications WHERE delivered_at IS NULL") == [(0,)]
    finally:
        receiver.close()


@pytest.mark.slow  # three tries of 2 s
def test_a_receiver_that_trickles_its_status_line_is_cut_off_at_notify_timeout_s(
    cli: Callable[..., Any], tmp_path: Path, sql: Callable[..., list[Any]]
) -> None:
    # Each byte within notify_timeout_s (2 s) of the last, 40 s to a whole answer: urllib's
    # timeout is per read, so only a deadline on the exchange ends each try.
    def trickle(h: BaseHTTPRequestHandler) -> None:
        answer = b"HTTP/1.1 200 OK\r\nX-Pad: " + b"a" * 200 + b"\r\nContent-Length: 0\r\n\r\n"
        try:
            for byte in answer:
                h.wfile.write(bytes([byte]))
                h.wfile.flush()
                time.sleep(0.2)
        except OSError:
            pass  # the deliverer hung up

    receiver = _Hostile(trickle)
    try:
        extra = config(tmp_path, [{"url": receiver.url}])
        result = cli("notify", "test", extra_env=extra, timeout=60)
        assert result.code == 1, result.stdout + result.stderr
        assert "no answer within notify_timeout_s (2 s)" in result.stderr, result.stderr
        assert receiver.asked == ["POST /hook"] * 3  # each try cut off, then tried again
        assert sql("SELECT count(*) FROM notifications WHERE delivered_at IS NULL") == [(1,)]
    finally:
        receiver.close()


def test_a_command_target_gets_no_credential_of_the_process(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    seen = tmp_path / "env.json"
    program = f"import json, os; open({str(seen)!r}, 'w').write(json.dumps(dict(os.environ)))"
    extra = config(tmp_path, [{"command": ["python3", "-c", program]}])
    extra |= {
        "OPENAI_API_KEY": "sk-proj-0123456789abcdef0123456789",
        "SLACK_BOT_TOKEN": "xoxb-0123456789-abcdef",
        "MIRROR_URL": "https://ci:hunter2hunter2@mirror.example/simple",
        "DBUS_SESSION_BUS_ADDRESS": "unix:path=/run/user/1000/bus",  # notify-send needs it
    }
    result = cli("notify", "test", extra_env=extra)
    assert result.code == 0, result.stderr
    got = json.loads(seen.read_text())
    assert not {"OPENAI_API_KEY", "SLACK_BOT_TOKEN", "MIRROR_URL"} & set(got)
    assert "hunter2hunter2" not in seen.read_text()
    assert got["DBUS_SESSION_BUS_ADDRESS"] == extra["DBUS_SESSION_BUS_ADDRESS"]
    assert got["DURABLE_AGENT_EVENT"] == "test"


def test_an_undelivered_webhook_is_named_without_its_path_or_query(
    cli: Callable[..., Any], tmp_path: Path
) -> None:
    # A Slack or Discord hook's URL is its credential, in the path; others take ?token=.
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing answers there
    url = f"http://127.0.0.1:{port}/services/T0/B0/capabilitypath0123?token=querysecret0123"
    result = cli("notify", "test", extra_env=config(tmp_path, [{"url": url}]))
    assert result.code == 1
    assert f"to http://127.0.0.1:{port}/" in result.stderr
    assert "capabilitypath0123" not in result.stderr and "querysecret0123" not in result.stderr


TOKEN_PATH, TOKEN_QUERY = "capabilitypath0123", "querysecret0123"


def test_the_store_names_a_webhook_without_its_path_or_query(
    cli: Callable[..., Any],
    write_script: Callable[..., str],
    tmp_path: Path,
    receiver: Receiver,
    sql: Callable[..., list[Any]],
    db_path: Path,
) -> None:
    # The outbox row is the store's: a Slack hook's path, a ?token= never reach it. The
    # deliverer still posts to the whole URL, found by the name in its config.
    url = f"{receiver.url}/T0/B0/{TOKEN_PATH}?token={TOKEN_QUERY}"
    extra = config(tmp_path, [hook(receiver, url=url)])
    assert cli("start", "t", "--model", write_script(DONE), extra_env=extra).code == 0
    (request,) = receiver.requests
    assert request["path"] == f"/hook/T0/B0/{TOKEN_PATH}?token={TOKEN_QUERY}"
    ((target, delivered),) = sql("SELECT target, delivered_at IS NOT NULL FROM notifications")
    assert delivered == 1
    digest = hashlib.sha256(url.encode()).hexdigest()[:16]
    assert target == f"http://127.0.0.1:{receiver.port}/... sha256:{digest}"
    # Nowhere in the store's files, its write-ahead log included.
    for path in db_path.parent.glob(db_path.name + "*"):
        data = path.read_bytes()
        assert TOKEN_PATH.encode() not in data and TOKEN_QUERY.encode() not in data, path
    # Two hooks on one host are told apart.
    other = hook(receiver, url=f"{receiver.url}/T0/B0/another")
    result = cli("notify", "test", extra_env=config(tmp_path, [hook(receiver, url=url), other]))
    assert result.code == 0 and "delivered 2" in result.stdout, result.stderr
    assert {r["path"] for r in receiver.requests[1:]} == {
        f"/hook/T0/B0/{TOKEN_PATH}?token={TOKEN_QUERY}",
        "/hook/T0/B0/another",
    }


def test_rows_stored_with_the_whole_url_are_renamed_by_the_upgrade_and_still_sent(
    tmp_path: Path, receiver: Receiver
) -> None:
    # 0017 rewrites the outbox rows an earlier version stored; a pending one is delivered
    # once to its whole URL, and a row queued in the old form after the upgrade (by a
    # process of the earlier version) is sent too.
    import sqlite3

    from durable_agent.config.settings import Settings
    from durable_agent.notify import Deliverer
    from durable_agent.store.engine import make_engine, upgrade

    url = f"{receiver.url}/T0/B0/{TOKEN_PATH}?token={TOKEN_QUERY}"
    db = tmp_path / "old.db"
    engine = make_engine(f"sqlite:///{db}")
    upgrade(engine, "0016")
    engine.dispose()
    command = json.dumps(["notify-send", "done"])
    with sqlite3.connect(db) as conn:
        for key, target, delivered in [
            ("k-pending", url, None),
            ("k-sent", url, "2026-12-01 00:00:00"),
            ("k-command", command, "2026-12-01 00:00:00"),
        ]:
            conn.execute(
                "INSERT INTO notifications (idempotency_key, run_id, event, target, payload,"
                " created_at, attempts, delivered_at) VALUES (?, NULL, 'test', ?, ?,"
                " '2026-12-01 00:00:00', 0, ?)",
                (key, target, json.dumps({"event": "test", "idempotency_key": key}), delivered),
            )
    engine = make_engine(f"sqlite:///{db}")
    try:
        upgrade(engine)
        with sqlite3.connect(db) as conn:
            rows = dict(conn.execute("SELECT idempotency_key, target FROM notifications"))
            digest = hashlib.sha256(url.encode()).hexdigest()[:16]
            named = f"http://127.0.0.1:{receiver.port}/... sha256:{digest}"
            assert rows == {"k-pending": named, "k-sent": named, "k-command": command}
            conn.execute(
                "INSERT INTO notifications (idempotency_key, run_id, event, target, payload,"
                " created_at, attempts) VALUES ('k-late', NULL, 'test', ?, '{}',"
                " '2026-12-01 00:00:01', 0)",
                (url,),
            )
        settings = Settings(notify=[{"url": url, "secret": SECRET}], **FAST)
        done, errors = Deliverer(engine, settings).deliver_due()
        assert (done, errors) == (2, [])
        assert sorted(r["headers"]["idempotency-key"] for r in receiver.requests) == [
            "k-late",
            "k-pending",
        ]
        assert {r["path"] for r in receiver.requests} == {
            f"/hook/T0/B0/{TOKEN_PATH}?token={TOKEN_QUERY}"
        }
        assert Deliverer(engine, settings).deliver_due() == (0, [])
    finally:
        engine.dispose()


@pytest.mark.parametrize("backend", ["sqlite", "postgresql"])
def test_the_upgrade_renames_a_webhook_url_whatever_its_spelling(
    tmp_path: Path, receiver: Receiver, backend: str
) -> None:
    # urlsplit (the config's check) and urllib take `HTTPS://`, ` https://` (a space pasted
    # before it) as webhooks: rows an earlier version queued for them are renamed too, on
    # PostgreSQL (whose LIKE minds the case) as on SQLite, and still sent.
    import contextlib

    from scale_helpers import pg_rows, pg_schema

    from durable_agent.config.settings import Settings
    from durable_agent.notify import Deliverer
    from durable_agent.store.engine import make_engine, upgrade

    base = receiver.url.removeprefix("http://")
    urls = [
        f"HTTP://{base}/T0/{TOKEN_PATH}upper",
        f"Http://{base}/T0/{TOKEN_PATH}mixed",
        f" http://{base}/T0/{TOKEN_PATH}space",
        f"\thttp://{base}/T0/{TOKEN_PATH}tab",
    ]
    with contextlib.ExitStack() as stack:
        if backend == "sqlite":
            url = f"sqlite:///{tmp_path / 'old.db'}"
        else:
            url = stack.enter_context(pg_schema())
        engine = make_engine(url)
        stack.callback(engine.dispose)
        upgrade(engine, "0016")
        from sqlalchemy import text

        with engine.begin() as conn:
            for n, target in enumerate(urls):
                conn.execute(
                    text(
                        "INSERT INTO notifications (idempotency_key, run_id, event, target,"
                        " payload, created_at, attempts) VALUES (:key, NULL, 'test', :target,"
                        " :payload, '2026-12-01 00:00:00', 0)"
                    ),
                    {"key": f"k{n}", "target": target, "payload": json.dumps({"n": n})},
                )
        upgrade(engine)
        with engine.connect() as conn:
            targets = [r[0] for r in conn.execute(text("SELECT target FROM notifications"))]
        assert len(targets) == len(urls)
        assert not [t for t in targets if TOKEN_PATH in t], targets
        settings = Settings(notify=[{"url": u, "secret": SECRET} for u in urls], **FAST)
        assert Deliverer(engine, settings).deliver_due() == (len(urls), [])
        assert sorted(r["path"] for r in receiver.requests) == sorted(
            "/hook/T0/" + u.rpartition("/")[2] for u in urls
        )
        if backend == "postgresql":
            assert pg_rows(url, "SELECT count(*) FROM notifications") == [(len(urls),)]
        # A row an earlier version queued so after the upgrade, not delivered: its error
        # line names the host alone.
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            closed = s.getsockname()[1]  # nothing listens there once closed
        dead = f" HTTP://127.0.0.1:{closed}/T0/{TOKEN_PATH}dead"
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO notifications (idempotency_key, run_id, event, target,"
                    " payload, created_at, attempts) VALUES ('late', NULL, 'test', :target,"
                    " '{}', '2026-12-01 00:00:01', 0)"
                ),
                {"target": dead},
            )
        done, errors = Deliverer(engine, Settings(notify=[{"url": dead}], **FAST)).deliver_due()
        assert done == 0 and len(errors) == 1
        assert f"to http://127.0.0.1:{closed}/..." in errors[0]
        assert TOKEN_PATH not in errors[0], errors


@pytest.mark.parametrize(
    ("url", "name"),
    [
        ("https://user:pw0123@Hooks.Example.com/T/B/x", "https://hooks.example.com/..."),
        ("http://[::1]:8080/hook?token=t0123", "http://[::1]:8080/..."),
        ("https://user:pa/ss0123@host/x", "https://?/..."),  # (refused by the config)
        ("HTTPS://h.example:443/x", "https://h.example:443/..."),
    ],
)
def test_a_webhook_name_holds_no_userinfo_path_or_query(url: str, name: str) -> None:
    from durable_agent.config.settings import webhook_name

    named = webhook_name(url)
    assert named.startswith(name + " sha256:"), named
    assert len(named.rpartition("sha256:")[2]) == 16
    for secret in ("pw0123", "t0123", "ss0123", "pa", "/T/B/x"):
        assert secret not in named.partition(" ")[0].replace("https", "")


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("https://user:pa/ss0123@host.example/x", "port is not a number"),
        ("https://hooks.example.com/caf\u00e9/x", "ASCII"),
        ("ftp://hooks.example.com/x0123", "http:// or https://"),
    ],
)
def test_a_webhook_url_the_config_refuses_is_one_line_without_the_url(
    cli: Callable[..., Any], tmp_path: Path, url: str, why: str
) -> None:
    result = cli("notify", "test", extra_env=config(tmp_path, [{"url": url}]))
    assert result.code == 2 and why in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "0123" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_a_url_urllib_cannot_send_fails_its_row_and_not_the_pass(
    tmp_path: Path, receiver: Receiver
) -> None:
    # A target the config's check let through that urllib refuses (here made past the
    # check) is one row's error; the rows after it in the pass are still delivered.
    from durable_agent.config.settings import NotifyTarget, Settings
    from durable_agent.notify import Deliverer
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.outbox import Outbox

    engine = open_store_engine(f"sqlite:///{tmp_path / 's.db'}")
    try:
        bad = NotifyTarget.model_construct(
            url=f"http://127.0.0.1:{receiver.port}/caf\u00e9", command=None, secret=None
        )
        good = NotifyTarget(url=receiver.url)
        settings = Settings(**FAST)
        deliverer = Deliverer(engine, settings)
        deliverer.targets = {bad.target: bad, good.target: good}
        Outbox(engine).add(
            [
                {
                    "idempotency_key": key,
                    "run_id": None,
                    "event": "test",
                    "target": t.target,
                    "payload": {"event": "test", "idempotency_key": key},
                }
                for key, t in (("k-bad", bad), ("k-good", good))
            ]
        )
        done, errors = deliverer.deliver_due()
        assert done == 1 and len(errors) == 1 and "cannot be sent" in errors[0], errors
        assert [r["headers"]["idempotency-key"] for r in receiver.requests] == ["k-good"]
    finally:
        engine.dispose()
