"""The shape of the package, as a test that can fail: no import cycle, the layers
(DESIGN.md, "The next shape")."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "durable_agent"


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "demo/project" in path.as_posix():
            continue  # the demo's bundled sample project is data, not the package
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def _imports(path: Path, name: str, modules: dict[str, Path]) -> set[str]:
    """Package modules `name` imports anywhere (lazy imports too), except for type checking."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1]
                    + ([base] if base else [])
                )
            targets = [base] + [f"{base}.{a.name}" for a in node.names]
        out.update(t for t in targets if t in modules and t != name)
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, name, modules) for name, path in modules.items()}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt) :] + [nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_no_import_cycle_inside_the_package() -> None:
    graph = _graph()
    # A package imports its own submodules only for re-export; that is not a dependency back.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_step_modules_do_not_import_the_runner() -> None:
    graph = _graph()
    for name in (
        "durable_agent.loop.step",
        "durable_agent.loop.model_step",
        "durable_agent.loop.tool_step",
        "durable_agent.loop.finish_gate",
        "durable_agent.loop.step_context",
        "durable_agent.loop.approvals",
    ):
        assert "durable_agent.loop.runner" not in graph[name], name
    assert not any(
        t.startswith("durable_agent.")
        and t
        not in {
            "durable_agent.errors",
            "durable_agent.loop.guard",
            "durable_agent.models",
            "durable_agent.status",
            "durable_agent.observer",
            "durable_agent.redact",
            "durable_agent.loop.replay",
            "durable_agent.config.settings",
            "durable_agent.store.journal",
            "durable_agent.store.step",
            "durable_agent.tools.base",
        }
        for t in graph["durable_agent.loop.step_context"]
    )


def test_the_dead_code_once_found_stays_gone() -> None:
    """Names that were defined and never used (or written and never read): not back."""
    from durable_agent import errors, worker
    from durable_agent.cli import render
    from durable_agent.store import journal, queue, runs, schema

    gone = [
        (schema, "RUN_TIMELINE_SQL"),
        (journal.Journal, "add_messages"),
        (runs.Store, "request_cancel"),
        (queue.Queue, "live_leases"),
        (worker, "_new_owner"),
        (render, "step_json"),
        (errors.ModelError("x"), "permanent"),
        (journal.Journal, "finish_step"),
    ]
    assert [name for owner, name in gone if hasattr(owner, name)] == []


def _state_literals(tree: ast.AST) -> list[str]:
    """Comparisons of a step state, run status or approval decision with a bare string, and
    `decision="..."` keywords: these are spelt with their enums (store/records.py, status.py)."""
    from durable_agent.status import RunStatus
    from durable_agent.store.records import Decision, StepState

    values = {str(v) for enum in (StepState, Decision, RunStatus) for v in enum}
    names = {"state", "status", "decision"}

    def named(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in names) or (
            isinstance(node, ast.Name) and node.id in names
        )

    def literal(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and node.value in values

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides) and any(literal(s) for s in sides):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.keyword) and node.arg == "decision" and literal(node.value):
            found.append(ast.unparse(node))
    return found


def test_states_and_decisions_are_enums_not_string_literals() -> None:
    found = {
        name: hits
        for name, path in _modules().items()
        if (hits := _state_literals(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_literal_checker_finds_them() -> None:
    tree = ast.parse(
        'if s.state == "started" or "denied" != decision: f(decision="approved")\n'
        'ok = s.state == StepState.STARTED and s.kind == "model"'
    )
    assert _state_literals(tree) == [
        "s.state == 'started'",
        "'denied' != decision",
        "decision='approved'",
    ]


def test_the_workspace_layer_does_not_import_the_loop() -> None:
    graph = _graph()
    wrong = {
        (name, t)
        for name, targets in graph.items()
        if name.startswith("durable_agent.workspace")
        for t in targets
        if t.startswith("durable_agent.loop")
    }
    assert not wrong, sorted(wrong)


PRIMITIVE = "durable_agent.loop.step"
# What only the step primitive calls outside the store: the row's find/start/outcome, and the
# snapshots a step that can change files is measured between.
_ROW_CALLS = {"find", "step", "start", "defer", "complete", "fail"}
_SNAPSHOT_CALLS = {"before", "after"}


def _step_protocol_calls(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        owner, attr = ast.unparse(node.func.value), node.func.attr
        finds = attr in {"find", "step"} and owner.endswith("journal")
        rows = attr in _ROW_CALLS - {"find"} and (owner == "step" or owner.endswith(".step"))
        snapshots = attr in _SNAPSHOT_CALLS and owner.endswith("recorder")
        if finds or rows or snapshots:
            found.append(f"{owner}.{attr} (line {node.lineno})")
    return found


def test_only_the_step_primitive_sequences_a_step() -> None:
    found = {
        name: calls
        for name, path in _modules().items()
        if name != PRIMITIVE
        and not name.startswith("durable_agent.store")
        and (calls := _step_protocol_calls(path))
    }
    assert not found, found


def test_the_protocol_checker_finds_a_hand_made_step(tmp_path: Path) -> None:
    made = tmp_path / "m.py"
    made.write_text(
        "step = ctx.journal.find(key, kind, turn=0)\n"
        "step.start(x, workspace=recorder.before(ctx, step))\n"
        "step.complete(out, counters=c)\n"
    )
    assert len(_step_protocol_calls(made)) == 4
