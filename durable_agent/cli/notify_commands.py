"""`durable-agent notify test|deliver`: the notifications of the config's [[notify]]."""

from __future__ import annotations

import os
import sys
from argparse import Namespace

from durable_agent.cli import streams
from durable_agent.errors import ConfigError


def cmd_notify(args: Namespace, env: dict[str, str]) -> int:
    from durable_agent.config.settings import load_settings
    from durable_agent.notify import Deliverer
    from durable_agent.store.engine import open_store_engine
    from durable_agent.store.outbox import Outbox
    from durable_agent.store.rows import utcnow

    settings = load_settings({"db": args.db} if args.db else {}, env)
    if not settings.notify:
        raise ConfigError(
            "no [[notify]] entry in the config file: add one with url = ... or "
            "command = [...] (docs/observability.md)"
        )
    assert settings.db is not None
    engine = open_store_engine(settings.db)
    try:
        deliverer = Deliverer(engine, settings)
        if args.action == "test":
            base = f"test:{os.urandom(8).hex()}"
            payload = {"event": "test", "run_id": None, "at": utcnow().isoformat() + "Z"}
            Outbox(engine).add(
                [
                    {
                        "idempotency_key": f"{base}:{i}",
                        "run_id": None,
                        "event": "test",
                        "target": t.target,
                        "payload": {**payload, "idempotency_key": f"{base}:{i}"},
                    }
                    for i, t in enumerate(settings.notify)
                ]
            )
        done, errors = deliverer.deliver_due()
    finally:
        engine.dispose()
    out = streams.forgiving(sys.stdout)
    print(f"delivered {done} notification(s)", file=out)
    for problem in errors:
        print(streams.visible(f"not delivered: {problem}"), file=streams.forgiving(sys.stderr))
    return 1 if errors else 0
