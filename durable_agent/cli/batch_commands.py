"""`durable-agent batch submit|show|export|resume|cancel` (docs/fleets.md).

A batch is a first-class object in the store (`batches`, `batch_tasks`, `runs.batch_id`).
Each task of TASKS.jsonl becomes one queued run whose first step makes its own workspace
(loop/workspace_setup.py) under --workdir; workers drain the batch like any queued runs,
under its max_parallel, or `--run` drains it here in the foreground.
"""

from __future__ import annotations

import hashlib
import json
import re
import sys
import threading
import time
import uuid
from argparse import Namespace
from pathlib import Path
from typing import Any

from durable_agent.errors import ConfigError, UsageError
from durable_agent.status import RunStatus
from durable_agent.visible import visible

BUDGETS = ("max_steps", "max_tool_calls", "max_tokens", "max_cost", "max_seconds")
FIELDS = {"id", "task", "repo", "ref", "verify", "model", "priority", "metadata", "queue_key"}
FIELDS |= set(BUDGETS)
COMPLETED = RunStatus.COMPLETED
# Ended: not queued, running, or waiting for its child runs (docs/delegation.md).
WAS_DONE = tuple(
    s.value for s in RunStatus if s not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING)
)


def _open(args: Namespace, env: dict[str, str]) -> Any:
    from durable_agent.config.store import open_store

    return open_store(getattr(args, "db", None), env)


def _batch(store: Any, given: str) -> Any:
    from durable_agent.store import fleet

    found = fleet.find_batch(store.engine, given)
    if found is None:
        raise UsageError(f"no batch {given!r} (give its id, a unique id prefix, or its name)")
    return found


# -- submit ---------------------------------------------------------------------------------
def read_tasks(path: Path) -> list[tuple[int, dict[str, Any]]]:
    """The lines of TASKS.jsonl with their numbers, checked: a bad line is one error naming
    its line."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from None
    tasks: list[tuple[int, dict[str, Any]]] = []
    seen: set[str] = set()
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            task = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}:{n}: not JSON ({exc.msg})") from None
        if not isinstance(task, dict):
            raise UsageError(f"{path}:{n}: a task is a JSON object")
        unknown = sorted(set(task) - FIELDS)
        if unknown:
            raise UsageError(
                f"{path}:{n}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(FIELDS))})"
            )
        for name in ("id", "task", "repo"):
            if not isinstance(task.get(name), str) or not task[name].strip():
                raise UsageError(f"{path}:{n}: {name!r} must be a non-empty string")
        if len(task["id"]) > 200:
            raise UsageError(f"{path}:{n}: 'id' is longer than 200 characters")
        if task["id"] in seen:
            raise UsageError(f"{path}:{n}: task id {task['id']!r} appears twice in the file")
        seen.add(task["id"])
        for name in ("ref", "verify", "model", "queue_key"):
            if task.get(name) is not None and not isinstance(task[name], str):
                raise UsageError(f"{path}:{n}: {name!r} must be a string")
        for name in ("id", "repo", "ref", "model", "queue_key"):
            # Names, paths and keys: a NUL or a lone surrogate cannot be stored or hashed,
            # a control character hides in every listing.
            if isinstance(task.get(name), str) and not _plain(task[name]):
                raise UsageError(
                    f"{path}:{n}: {name!r} holds a control character or a lone surrogate"
                )
        for name in ("repo", "ref"):
            # Given to git as an argument: one starting with '-' would be read as an option
            # (`--upload-pack=...`).
            if isinstance(task.get(name), str) and task[name].startswith("-"):
                raise UsageError(f"{path}:{n}: {name!r} must not start with '-'")
        if _credentials(task["repo"]):
            raise UsageError(
                f"{path}:{n}: 'repo' carries credentials, which would be stored with the "
                "run: give them to git instead (a credential helper, ~/.netrc, an SSH key)"
            )
        if task.get("priority") is not None and type(task["priority"]) is not int:
            raise UsageError(f"{path}:{n}: 'priority' must be an integer")
        if task.get("priority") is not None and not -(2**31) <= task["priority"] < 2**31:
            raise UsageError(f"{path}:{n}: 'priority' is out of range (a 32-bit integer)")
        if task.get("metadata") is not None and not isinstance(task["metadata"], dict):
            raise UsageError(f"{path}:{n}: 'metadata' must be an object")
        for name in BUDGETS:
            value = task.get(name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float)
            ):
                raise UsageError(f"{path}:{n}: {name!r} must be a number")
        tasks.append((n, task))
    if not tasks:
        raise UsageError(f"{path}: no tasks (one JSON object a line)")
    return tasks


_CONTROL = re.compile(r"[\x00-\x1f\x7f\ud800-\udfff]")


def _plain(text: str) -> bool:
    return _CONTROL.search(text) is None


def _credentials(repo: str) -> bool:
    """Does the URL carry a password (`https://user:token@host/...`) or, over HTTP, a user
    (a token in the user's place: `https://ghp_...@github.com/...`)?"""
    if "://" not in repo:
        return False
    scheme, rest = repo.split("://", 1)
    userinfo, at, _host = rest.split("/", 1)[0].rpartition("@")
    return bool(at) and (":" in userinfo or scheme.lower() in ("http", "https"))


def folder_name(task_id: str, run_id: str) -> str:
    """The task's workspace folder under --workdir: readable, and distinct for distinct runs:
    the hash is the run's (its batch's and its task's), so two batches sharing a --workdir,
    or ids that read the same (`a/b` and `a_b`, two long ids cut at one length), never
    share a folder."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", task_id).lstrip(".")[:80] or "task"
    return f"{safe}-{hashlib.sha256(run_id.encode()).hexdigest()[:16]}"


def run_id_for(batch_id: str, task_id: str) -> str:
    """The task's run id, a function of the dedup key: a submit that died between making the
    run and recording the task finds the run again instead of making a second."""
    return f"{batch_id[:12]}-{hashlib.sha256(task_id.encode()).hexdigest()[:16]}"


def cmd_batch(args: Namespace, env: dict[str, str]) -> int:
    handler = {
        "submit": _submit,
        "show": _show,
        "export": _export,
        "resume": _resume,
        "cancel": _cancel,
    }[args.action]
    return handler(args, env)


def _submit(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.store import fleet
    from durable_agent.wiring import build_runner

    if args.target is None:
        raise UsageError("usage: durable-agent batch submit TASKS.jsonl --workdir DIR")
    if args.workdir is None:
        raise UsageError("batch submit needs --workdir DIR: each task's workspace is made there")
    if args.max_parallel is not None and args.max_parallel < 1:
        raise UsageError("--max-parallel must be at least 1")
    if args.concurrency < 1:
        raise UsageError("--concurrency must be at least 1")
    path = Path(args.target)
    tasks = read_tasks(path)
    seqs = {task["id"]: seq for seq, (_n, task) in enumerate(tasks)}
    workdir = Path(args.workdir).expanduser().resolve()
    try:
        workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError(f"--workdir {args.workdir}: {exc.strerror or exc}") from None
    name = args.name or path.stem
    store = _open(args, env)
    # Every new task's settings are made (and so checked) before the batch or any run is:
    # a bad line is refused before anything is queued.
    there = fleet.batch_named(store.engine, name)
    batch_id = there.id if there is not None else uuid.uuid4().hex[:16]
    folder = Path(there.workdir) if there is not None else workdir
    have = fleet.task_runs(store.engine, batch_id) if there is not None else {}
    todo: list[tuple[dict[str, Any], str, Any]] = []
    models: set[Any] = set()
    for n, task in tasks:
        if task["id"] in have:
            continue  # dedup: batch name + task id
        run_id = run_id_for(batch_id, task["id"])
        settings = None
        if not store.run_exists(run_id):  # (a submit that died after making it: recorded below)
            settings = _task_settings(args, env, path, n, task, folder, run_id)
            if settings.model not in models:  # the model can be built here (once per model)
                models.add(settings.model)
                try:  # (in --workdir: the task's placeholder is not made yet)
                    build_runner(
                        settings.model_copy(update={"workspace": folder}), env=env, store=store
                    )
                except UsageError as exc:  # (ConfigError too: its exit code is kept)
                    raise type(exc)(f"{path}:{n}: {exc}") from None
        todo.append((task, run_id, settings))
    batch, made = fleet.open_batch(store.engine, batch_id, name, str(folder), args.max_parallel)
    if batch.id != batch_id:
        raise UsageError(f"batch {name!r} was made by another submit just now: submit again")
    added = 0
    for task, run_id, settings in todo:
        made_here = False
        if settings is not None and not store.run_exists(run_id):
            Path(settings.workspace).mkdir(exist_ok=True)  # the placeholder its step fills
            runner = build_runner(settings, env=env, store=store)
            try:
                runner.create(
                    task["task"],
                    run_id,
                    queue={
                        "batch_id": batch.id,
                        "priority": task.get("priority"),
                        "queue_key": task.get("queue_key"),
                    },
                    # In the run's own transaction: a submit killed anywhere leaves no run
                    # its batch does not list (batch show, the batch's finish, resume,
                    # cancel).
                    batch_task={"task_id": task["id"], "seq": seqs[task["id"]], "spec": task},
                )
                made_here = True
            except Exception:
                # Another submit of the file made it since this one looked (its key, or
                # the id taken): that submit's, with its task row, unless gone again.
                if not store.run_exists(run_id):
                    raise
        if made_here or fleet.add_task(
            store.engine, batch.id, task["id"], run_id, seqs[task["id"]], task
        ):  # (a run made by a submit of an earlier version killed before its task row)
            added += 1
    skipped = len(tasks) - added
    print(
        f"batch {batch.id} ({batch.name}) · {added} task(s) queued"
        + (f" · {skipped} already in the batch" if skipped else "")
        + ("" if made else " · added to the existing batch"),
        file=sys.stderr,
    )
    print(batch.id)
    if args.run:
        return _drain(store, batch, args, env)
    return 0


def _task_settings(
    args: Namespace,
    env: dict[str, str],
    path: Path,
    n: int,
    task: dict[str, Any],
    workdir: Path,
    run_id: str,
) -> Any:
    """The settings of a task's run, or one error naming its line."""
    from durable_agent.config.settings import load_settings

    repo = task["repo"]
    if "://" not in repo and not repo.startswith("git@"):
        local = (path.parent / repo).expanduser().resolve()
        if not local.is_dir():
            raise UsageError(f"{path}:{n}: task {task['id']!r}: repo {repo!r} is not a directory")
        repo = str(local)
    flags: dict[str, Any] = {
        "workspace": workdir / folder_name(task["id"], run_id),
        "db": args.db,
        "model": task.get("model") or args.model,
        "base_url": args.base_url,
        "verify": task.get("verify"),
        "shell": args.shell,
        "sandbox": args.sandbox,
        "workspace_repo": repo,
        "workspace_ref": task.get("ref"),
        **{b: task.get(b) for b in BUDGETS},
    }
    try:
        return load_settings({k: v for k, v in flags.items() if v is not None}, env)
    except UsageError as exc:  # (ConfigError too: its exit code is kept)
        raise type(exc)(f"{path}:{n}: {exc}") from None


def _drain(store: Any, batch: Any, args: Namespace, env: dict[str, str]) -> int:
    """Run the batch here with N runs at once (a worker on this batch only, until nothing is
    left), with a progress line on stderr."""
    from durable_agent.config.settings import load_settings
    from durable_agent.store import fleet
    from durable_agent.worker import Log, Worker, WorkerOptions

    settings = load_settings({"db": args.db} if args.db else {}, env)
    assert settings.db is not None
    options = WorkerOptions(
        db=settings.db,
        concurrency=args.concurrency,
        lease_seconds=settings.lease_seconds,
        poll_s=0.2,
        once=True,
        quiet=True,
        batch=batch.id,
    )
    log = Log(open("/dev/null", "w") if not args.verbose else sys.stderr)  # noqa: SIM115
    stop = threading.Event()
    start = time.monotonic()
    progress = threading.Thread(
        target=_progress, args=(store, batch.id, stop, start), name="batch-progress", daemon=True
    )
    progress.start()
    worker = Worker(store, options, env, log)
    worker.notify_settings = settings if settings.notify else None  # batch_done, runs' ends
    try:
        worker.run()
    finally:
        stop.set()
        progress.join()
    rows = fleet.task_rows(store.engine, batch.id)
    print(_progress_line(rows, start, time.monotonic()), file=sys.stderr)
    # (no run of it ended in this process)
    if fleet.finish_if_done(store.engine, batch.id, worker.batch_done_targets()):
        worker.batch_done(batch.id)
    return 0 if all(r.status == COMPLETED for r in rows) else 1


def _progress(store: Any, batch_id: str, stop: threading.Event, start: float) -> None:
    from durable_agent.store import fleet

    tty = sys.stderr.isatty()
    last = ""
    while not stop.wait(0.5 if tty else 5.0):
        try:
            line = _progress_line(fleet.task_rows(store.engine, batch_id), start, time.monotonic())
        except Exception:  # noqa: BLE001 - the progress line must never stop the batch
            continue
        if tty:
            print("\r" + line + "\033[K", end="", file=sys.stderr, flush=True)
        elif line != last:
            print(line, file=sys.stderr, flush=True)
        last = line
    if tty:
        print(file=sys.stderr)


def _progress_line(rows: list[Any], start: float, now: float) -> str:
    total = len(rows)
    done = sum(r.status == COMPLETED for r in rows)
    failed = sum(r.status in WAS_DONE and r.status != COMPLETED for r in rows)
    running = sum(r.status in (RunStatus.RUNNING, RunStatus.WAITING) for r in rows)
    ended = done + failed
    secs = max(now - start, 1e-6)
    rate = ended / secs * 60
    eta = f"{(total - ended) / (ended / secs):.0f}s" if ended else "?"
    cost = sum(r.cost for r in rows if r.cost is not None)
    bar_n = int(20 * ended / total) if total else 20
    return (
        f"[{'#' * bar_n}{'.' * (20 - bar_n)}] {ended}/{total} · {done} done · {failed} failed · "
        f"{running} running · {rate:.1f}/min · ETA {eta} · cost {cost:.4f}"
    )


# -- show -----------------------------------------------------------------------------------
def _percentile(values: list[float], p: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1))))
    return float(ordered[k])


def summary(batch: Any, rows: list[Any]) -> dict[str, Any]:
    times = [r.active_ms / 1000 for r in rows if r.status in WAS_DONE]
    verified = [r for r in rows if r.verify is not None]
    costs = [r.cost for r in rows if r.cost is not None]
    by_status: dict[str, int] = {}
    for r in rows:
        by_status[r.status] = by_status.get(r.status, 0) + 1
    return {
        "batch_id": batch.id,
        "name": batch.name,
        "status": batch.status,
        "tasks": len(rows),
        "by_status": by_status,
        "verified": len(verified),
        "passed": sum(r.verify == "pass" for r in rows),
        "pass_rate": (sum(r.verify == "pass" for r in rows) / len(verified)) if verified else None,
        "cost": sum(costs) if costs else None,
        "prompt_tokens": sum(r.prompt_tokens for r in rows),
        "completion_tokens": sum(r.completion_tokens for r in rows),
        "p50_seconds": _percentile(times, 50),
        "p95_seconds": _percentile(times, 95),
    }


def _show(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.store import fleet

    if args.target is None:
        raise UsageError("usage: durable-agent batch show ID [--json]")
    store = _open(args, env)
    batch = _batch(store, args.target)
    rows = fleet.task_rows(store.engine, batch.id)
    totals = summary(batch, rows)
    if args.json:
        tasks = [
            {
                "task_id": r.task_id,
                "run_id": r.run_id,
                "status": r.status,
                "stop_reason": r.stop_reason,
                "verify": r.verify,
                "model_calls": r.step_count,
                "tool_calls": r.tool_call_count,
                "prompt_tokens": r.prompt_tokens,
                "completion_tokens": r.completion_tokens,
                "cost": r.cost,
                "seconds": r.active_ms / 1000,
            }
            for r in rows
        ]
        print(json.dumps({**totals, "task_rows": tasks}, ensure_ascii=False))
        return 0
    print(
        f"batch {batch.id} · {visible(batch.name)} · {batch.status} · workdir {visible(batch.workdir)}"
    )
    print(
        f"{'TASK':<28} {'RUN':<30} {'STATUS':<16} {'STOP':<16} {'VERIFY':<6} "
        f"{'CALLS':>5} {'TOKENS':>9} {'COST':>8} {'TIME':>7}"
    )
    for r in rows:
        cost = r.cost
        task_id = visible(r.task_id)
        print(
            f"{task_id[:28]:<28} {r.run_id:<30} {r.status:<16} {(r.stop_reason or '-'):<16} "
            f"{(r.verify or '-'):<6} {r.step_count:>5} {r.prompt_tokens + r.completion_tokens:>9} "
            f"{'-' if cost is None else f'{cost:.4f}':>8} {r.active_ms / 1000:>6.1f}s"
        )
    rate = totals["pass_rate"]
    p50, p95 = totals["p50_seconds"], totals["p95_seconds"]
    print(
        f"{totals['tasks']} tasks · "
        + ", ".join(f"{n} {s}" for s, n in sorted(totals["by_status"].items()))
        + f" · verify: {totals['passed']}/{totals['verified']} passed"
        + (f" ({rate:.0%})" if rate is not None else "")
        + f" · cost {'-' if totals['cost'] is None else format(totals['cost'], '.4f')}"
        + f" · p50 {'-' if p50 is None else f'{p50:.1f}s'} · p95 {'-' if p95 is None else f'{p95:.1f}s'}"
    )
    return 0


# -- export ---------------------------------------------------------------------------------
def run_patch(store: Any, run_id: str) -> bytes:
    """What the run changed from its first snapshot to its last, as `git apply` takes it
    (the `diff` command's machinery)."""
    from durable_agent.store.blobs import first_tree, tree_at
    from durable_agent.workspace import diffing

    before = first_tree(store.engine, run_id)
    if before is None:
        return b""
    last = tree_at(store.engine, run_id)
    old, new, found, blobs = diffing.between(store.engine, before, last.tree if last else None)
    return b"".join(diffing.patch(old, new, found, blobs.blob))


def _export(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.store import fleet

    if args.target is None or args.preds is None:
        raise UsageError("usage: durable-agent batch export ID --preds FILE")
    store = _open(args, env)
    batch = _batch(store, args.target)
    rows = fleet.task_rows(store.engine, batch.id)
    written = 0
    lines = []
    for r in rows:
        if r.status != COMPLETED and not args.all:
            continue
        patch = run_patch(store, r.run_id).decode("utf-8", "surrogateescape")
        lines.append(
            json.dumps(
                {
                    "instance_id": r.task_id,
                    "model_name_or_path": r.model,
                    "model_patch": patch,
                },
                ensure_ascii=False,
            )
        )
        written += 1
    out = Path(args.preds)
    try:
        out.write_text(
            "".join(line + "\n" for line in lines), encoding="utf-8", errors="surrogateescape"
        )
    except OSError as exc:
        raise UsageError(f"cannot write {args.preds}: {exc.strerror or exc}") from None
    left = len(rows) - written
    print(
        f"{written} prediction(s) written to {args.preds}"
        + (f" · {left} task(s) not completed left out (--all includes them)" if left else ""),
        file=sys.stderr,
    )
    return 0


# -- resume / cancel ------------------------------------------------------------------------
def _resume(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.store import fleet

    if args.target is None:
        raise UsageError("usage: durable-agent batch resume ID [--run --concurrency N]")
    store = _open(args, env)
    batch = _batch(store, args.target)
    queued = fleet.resume_batch(store.engine, batch.id)
    print(
        f"batch {batch.id} · {queued} stopped task(s) queued again; unfinished ones continue "
        "from their last step",
        file=sys.stderr,
    )
    if args.run:
        return _drain(store, batch, args, env)
    return 0


def _cancel(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.store import fleet

    if args.target is None:
        raise UsageError("usage: durable-agent batch cancel ID")
    store = _open(args, env)
    batch = _batch(store, args.target)
    queued, asked = fleet.cancel_batch(store.engine, batch.id)
    from durable_agent.config.settings import load_settings

    settings = load_settings({"db": args.db} if args.db else {}, env)
    wanted = settings.notify_targets("batch_done")
    if fleet.finish_if_done(store.engine, batch.id, wanted) and wanted:
        from durable_agent.notify import Deliverer  # sent now; a worker's pass would too

        Deliverer(store.engine, settings, store.policy).deliver_due()
    print(
        f"batch {batch.id} cancelled · {queued} queued task(s) cancelled · {asked} running "
        "task(s) stop at their next step (`batch resume` continues them)",
        file=sys.stderr,
    )
    return 0
