"""`durable-agent compact RUN_ID`: compact a stopped run by hand, before `resume`.

The same compact steps as a running loop takes (compaction.py), forced: older outputs are
elided and the older turns summarized even below the threshold, unless the summary would
not shrink the request (too little to summarize): that is skipped, unpaid, and said. The command holds the
run's lease while it works, renewed through a long summary call (a live run is refused,
exit 6), and puts the run back as it was found — status, stop reason, answer and error — so `resume` continues it as before,
now with the smaller request.
"""

from __future__ import annotations

import time

from msgspec import Struct

from durable_agent.errors import UsageError
from durable_agent.loop import compaction
from durable_agent.loop.heartbeat import Heartbeat
from durable_agent.loop.runner import Runner
from durable_agent.status import RESUMABLE
from durable_agent.store import leases
from durable_agent.store.journal import Journal


class Compacted(Struct, frozen=True):
    before: int
    after: int
    steps: int  # compact steps recorded
    note: str | None = None  # why no summary was made, when one would not have helped


def compact_run(runner: Runner, run_id: str) -> Compacted:
    store = runner.store
    run = store.get_run(run_id)
    if run.status not in RESUMABLE:
        raise UsageError(
            f"run {run_id} is {run.status}; only a stopped run that can be resumed is compacted"
        )
    owner = leases.new_owner()
    # How the run stands when the lease is ours (a session may have ended since the read above):
    # what is put back when the compaction is done.
    # Its status kept while it works: a kill before it is put back leaves the run as it was
    # (a `running` run with a dead owner would pass for one cut off in its turn).
    epoch, (status, stop_reason, answer, error) = store.take_over(
        run_id, owner, runner.settings.lease_seconds, keep_status=True
    )
    journal = Journal(
        store.engine,
        run_id,
        owner,
        epoch,
        runner.settings.lease_seconds,
        policy=runner.store_policy,
        sleep=runner.sleep,
    )
    try:
        ctx = runner.context(journal, time.monotonic())
        s = ctx.state
        before = compaction.count(ctx, s.request())
        made, start = s.view.compactions, s.view.start
        try:  # the lease renewed while the summary call runs (it may outlast the lease)
            with Heartbeat(journal, max(0.2, runner.settings.lease_seconds / 3), runner.cancel):
                compaction.compact(ctx, [], before, forced=True, by_hand=True)
        finally:  # as it was found, also when the summary call failed (its step says why)
            journal.finish_run(
                status=status,
                stop_reason=stop_reason,
                answer=answer,
                error=error,
                counters=ctx.counters(),
            )
        note = compaction.why_no_summary(ctx) if s.view.start == start else None
        return Compacted(
            before, compaction.count(ctx, s.request()), s.view.compactions - made, note
        )
    finally:
        journal.release_lease()
        journal.close()
