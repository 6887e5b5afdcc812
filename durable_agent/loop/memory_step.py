"""Project memory as durable steps of kind `memory` (docs/memory.md).

A new run reads its instruction files (AGENTS.md, `memory_files`) once, before its first
model call: step `memory:0`, whose intent records what was read (the folder, each file's
path, sha256 and size, and the composed text) and whose outcome adds the text to the
history as a system message after the system prompt and the task. From then on the run
goes by the recorded message: a resume reads the files only to say, in one line, that they
changed since. An attempt cut off by a crash runs again with its recorded input, not with
the files as they are by then.

`reload_memory(ctx, turn)` reads the files again for a run that goes on with a new turn
(`continue`; a fork does it by itself, step `memory:fork:<fork_seq>`): when their text is
not the one in effect, a new memory message is appended. The history before it is never
rewritten, so the provider's prompt cache of it stays valid; the model goes by the last
memory message. The compacted view keeps memory messages verbatim (context/view.py).
"""

from __future__ import annotations

from typing import Any

from durable_agent.context.memory import Memory, memory_in_effect, memory_sha256
from durable_agent.loop.step import StepOutcome, StepSpec, open_step
from durable_agent.loop.step_context import StepContext
from durable_agent.messages import Message
from durable_agent.status import StepKind
from durable_agent.store.step import Step
from durable_agent.workspace.memory import read_memory

FIRST_KEY = "memory:0"

__all__ = ["FIRST_KEY", "load_memory", "memory_sha256", "reload_memory", "run_memory_sha256"]


def run_memory_sha256(ctx: StepContext) -> str | None:
    """sha256 of the memory text the run goes by now (None: it has none), for a fingerprint
    of what the model was told (context.memory.memory_sha256 of the message's text)."""
    text = memory_in_effect(ctx.state.messages)
    return None if text is None else memory_sha256(text)


def load_memory(ctx: StepContext, *, new_turn: int | None = None) -> None:
    """At the start of every session (Runner._drive), after the workspace is checked.

    `new_turn`: the session goes on with a new turn of a finished run (`continue`): the
    files are read again for it (`reload_memory`) instead of only being compared."""
    if not ctx.settings.memory:
        return
    if new_turn is not None:
        reload_memory(ctx, new_turn)
        return
    memory = _read(ctx)
    fresh = _text(ctx, memory)
    if ctx.forked_at is not None:  # a fork goes on from another run's history: read again
        used = _memory_step(
            ctx, f"memory:fork:{ctx.forked_at}", ctx.state.turn, memory, only_if_changed=True
        )
    elif ctx.state.step_count == 0 and not _first_call_begun(ctx):
        used = _memory_step(ctx, FIRST_KEY, 0, memory, only_if_changed=False)
    else:
        used = None
    if used is None:  # recorded before this session
        recorded = _in_effect(ctx)
        if recorded is None:
            done = ctx.journal.completed(FIRST_KEY)
            if done is None and not fresh:
                return  # a run without memory (recorded by an older version)
            recorded = ""
        used = recorded
    if memory_sha256(used) != memory_sha256(fresh):
        ctx.observer.note(
            "project memory changed since the run recorded it"
            f" ({', '.join(f.path for f in memory.files) or 'none found now'}): it goes on with the recorded text; "
            "`continue` or a fork reads the files again"
        )


def _first_call_begun(ctx: StepContext) -> bool:
    """The run's first model call was made (cut off by a crash: its step is `started`)
    without a memory message: none was found then (no step is recorded for that), or an older
    version made the call. The request it was sent is the run's: a memory message read now
    would change it, and the call's step would no longer match (`step_mismatch`)."""
    return any(st.kind == StepKind.MODEL for st in ctx.journal.open_steps.values())


def reload_memory(ctx: StepContext, turn: int, *, key: str | None = None) -> None:
    """Read the memory files again for a new turn of the run (`continue`): a memory message
    is added when their text is not the one in effect. Call it on the rebuilt context
    (Runner.context) under the run's lease, before the turn's first model call, in place of
    `load_memory` (or as `load_memory(ctx, new_turn=turn)`); the key
    (`memory:<turn>:reload`) makes it happen once per turn, crash or not."""
    if not ctx.settings.memory:
        return
    _memory_step(ctx, key or f"memory:{turn}:reload", turn, _read(ctx), only_if_changed=True)


def _read(ctx: StepContext) -> Memory:
    s = ctx.settings
    return read_memory(s.workspace, s.memory_dir, s.memory_files, ctx.env, ctx.redactor.redact)


def _text(ctx: StepContext, memory: Memory) -> str:
    """What the model is sent: the composed text, redacted as tool results are."""
    return ctx.redactor.redact(memory.text) if memory.text else ""


def _memory_step(
    ctx: StepContext, key: str, turn: int, memory: Memory, *, only_if_changed: bool
) -> str | None:
    """The step: the text it used (its recorded input on a re-run), or None when it was
    completed before."""
    text = _text(ctx, memory)
    given = {
        "dir": ctx.settings.memory_dir or ".",
        "files": memory.listing(),
        "sha256": memory_sha256(text),
        "cut": memory.cut,
        "text": text,
    }
    spec = StepSpec(
        StepKind.MEMORY,
        key,
        turn,
        input=given,
        label="",
        detail=_detail(memory),
        reuse=True,
        # A fork's or a new turn's read stands in for an earlier one of the same turn left
        # unfinished (a fork of a run cut off inside its first read).
        supersede=key != FIRST_KEY,
    )
    call = open_step(ctx, spec)
    if call.reused is not None:
        return None
    recorded = _as_dict(call.input) or given  # an interrupted attempt's, else this one
    used = str(recorded.get("text") or "")
    if not used and not _in_effect(ctx):
        return used  # nothing read, nothing to take back: no step (the seqs stay as they were)

    def add(_step: Step) -> StepOutcome:
        in_effect = _in_effect(ctx)
        messages: list[Message] = []
        seq = None
        if used and not (only_if_changed and in_effect == used):
            message = Message("system", used)
            seq = ctx.state.append(message)
            messages.append(message)
        elif only_if_changed and in_effect and not used:
            # The files are gone: say so, rather than keep instructions nobody has any more.
            message = Message("system", _NONE_LEFT)
            seq = ctx.state.append(message)
            messages.append(message)
        output = {
            "sha256": recorded.get("sha256"),
            "files": recorded.get("files"),
            "message": seq,
        }
        return StepOutcome(output, messages=messages)

    call.run(add, input=recorded)
    return used


_NONE_LEFT = (
    "# Project memory\n(no instruction files are found any more: the earlier ones no longer apply)"
)


def _in_effect(ctx: StepContext) -> str | None:
    """The memory text the model goes by ("" once the files were found gone), None: none."""
    text = memory_in_effect(ctx.state.messages)
    return "" if text == _NONE_LEFT else text


def _as_dict(value: Any) -> dict[str, Any] | None:
    value = getattr(value, "value", value)  # a payload of a kind the store does not type
    return value if isinstance(value, dict) else None


def _detail(memory: Memory) -> str:
    if not memory.files:
        return "no instruction files found"
    names = ", ".join(f.path for f in memory.files)
    size = sum(f.size for f in memory.files)
    cut = f", cut by {memory.cut:,} bytes" if memory.cut else ""
    return f"{names} ({size:,} bytes{cut})"
