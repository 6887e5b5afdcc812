"""Small helpers shared by the store modules: the clock, lease owners, message rows."""

from __future__ import annotations

import os
import socket
import uuid
from datetime import UTC, datetime
from typing import Any

from durable_agent.messages import Message, ToolCall
from durable_agent.store.storable import storable


def utcnow() -> datetime:
    return datetime.now(UTC).replace(tzinfo=None)


def new_owner() -> str:
    """host:pid:nonce — the host and pid let a same-host resume see that the owner died."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


def owner_is_dead(owner: str) -> bool:
    """True only when we can prove it: same host and that pid is gone."""
    host, _, rest = owner.partition(":")
    pid_text = rest.partition(":")[0]
    if host != socket.gethostname() or not pid_text.isdigit():
        return False
    try:
        os.kill(int(pid_text), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


def message_from_row(row: Any) -> Message:
    calls = tuple(ToolCall.from_dict(c) for c in (row.tool_calls or ()))
    return Message(role=row.role, content=row.content, tool_calls=calls, tool_call_id=row.tool_call_id)


def message_values(run_id: str, seq: int, message: Message, step_seq: int | None, now: datetime) -> dict[str, Any]:
    return storable({
        "run_id": run_id,
        "seq": seq,
        "role": message.role,
        "content": message.content,
        "tool_calls": [c.to_dict() for c in message.tool_calls] or None,
        "tool_call_id": message.tool_call_id,
        "step_seq": step_seq,
        "created_at": now,
    })
