"""The shape of the package, as tests that can fail: no import cycle, the layers (a
package imports only its own layer and those below it), SQL only in store/, openai only in
models/, and the web view and MCP loaded only when used. Each checker is shown catching a
violation, so a rule cannot pass by checking nothing."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

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


def _external(path: Path) -> set[str]:
    """Top-level names of the modules outside the package that `path` imports (lazy imports
    too), except for type checking."""
    tree = ast.parse(path.read_text())
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for n in ast.walk(node))
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
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


@pytest.mark.slow  # over 2 s on 2 cores
def test_no_import_cycle_inside_the_package() -> None:
    graph = _graph()
    # A package imports its own submodules only for re-export; that is not a dependency back.
    for name in graph:
        graph[name] = {t for t in graph[name] if not t.startswith(name + ".")}
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_checker_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


# -- layers ----------------------------------------------------------------------------------
# Each row is a layer; a package (or top-level module) of the package imports only from its own
# row and the rows above it. Names are what follows `durable_agent.`; "" is the package's own
# __init__ (its version and lazily loaded public names).
LAYERS: list[set[str]] = [
    {
        "",
        "errors",
        "status",
        "messages",
        "visible",
        "redact",
        "observer",
        "capped",
        "encoding",
        "live",
    },
    {"store"},
    {"config"},
    {"tools", "models", "mcp"},
    {"workspace", "context", "tool_sources"},
    {"loop"},
    {"transcript", "presentation", "wiring", "api", "worker", "notify", "schedules"},
    {"ui"},
    {"cli", "demo", "__main__"},
]

# Imports that still run the wrong way, each a known debt with its way out (none is left).
# The checker fails on any other, and on an entry here that no longer exists.
KNOWN_WRONG_WAY: set[tuple[str, str]] = set()


def _layer_of(module: str, layers: list[set[str]]) -> int:
    name = module.removeprefix("durable_agent").removeprefix(".").split(".")[0]
    found = [i for i, row in enumerate(layers) if name in row]
    assert found, f"{module}: its package is in no row of LAYERS"
    return found[0]


def _wrong_way(
    graph: dict[str, set[str]], layers: list[set[str]], known: set[tuple[str, str]]
) -> tuple[list[tuple[str, str]], set[tuple[str, str]]]:
    """(imports from a lower layer up to a higher one not in `known`, entries of `known`
    that are not imports any more)."""
    up = {
        (a, b)
        for a, targets in graph.items()
        for b in targets
        if _layer_of(b, layers) > _layer_of(a, layers)
    }
    return sorted(up - known), known - up


def test_packages_depend_inward_only() -> None:
    new, gone = _wrong_way(_graph(), LAYERS, KNOWN_WRONG_WAY)
    assert new == [], "imports against the layers (tests/test_structure.py, LAYERS)"
    assert gone == set(), "no longer imported: take them out of KNOWN_WRONG_WAY"


def test_the_layer_checker_finds_an_import_upwards() -> None:
    layers = [{"store"}, {"loop"}, {"cli", "ui"}]
    graph = {
        "durable_agent.store.a": {"durable_agent.loop.b"},
        "durable_agent.loop.b": {"durable_agent.store.a"},
        "durable_agent.cli.c": {"durable_agent.ui.d"},  # the same row: allowed
        "durable_agent.ui.d": set(),
    }
    assert _wrong_way(graph, layers, set()) == (
        [("durable_agent.store.a", "durable_agent.loop.b")],
        set(),
    )
    known = {("durable_agent.store.a", "durable_agent.loop.b"), ("durable_agent.ui.d", "x")}
    assert _wrong_way(graph, layers, known) == ([], {("durable_agent.ui.d", "x")})


def test_the_web_view_imports_nothing_of_the_cli() -> None:
    graph = _graph()
    found = sorted(
        (a, b)
        for a, targets in graph.items()
        if a.startswith("durable_agent.ui")
        for b in targets
        if b.startswith("durable_agent.cli")
    )
    assert found == []


# -- who may import what ----------------------------------------------------------------------
# SQL is spoken by store/ only (and the migrations, outside the package); a module that must
# still hold a query of its own would be named here, with its way out (none is left).
SQL_OUTSIDE_STORE_KNOWN: set[str] = set()


def _importers(
    externals: dict[str, set[str]], names: set[str], inside: str, known: set[str]
) -> tuple[list[str], set[str]]:
    """(modules outside `inside` that import one of `names` and are not `known`, entries of
    `known` that do not import them any more)."""
    users = {m for m, ext in externals.items() if ext & names}
    outside = {m for m in users if not (m == inside or m.startswith(inside + "."))}
    return sorted(outside - known), known - users


def _externals() -> dict[str, set[str]]:
    return {name: _external(path) for name, path in _modules().items()}


def test_only_the_store_speaks_sql() -> None:
    new, gone = _importers(
        _externals(), {"sqlalchemy", "sqlite3"}, "durable_agent.store", SQL_OUTSIDE_STORE_KNOWN
    )
    assert new == [] and gone == set(), (new, gone)


def test_only_the_model_clients_import_openai() -> None:
    assert _importers(_externals(), {"openai"}, "durable_agent.models", set()) == ([], set())


def test_the_import_checkers_find_them(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\nimport sqlite3 as lite\n"
        "def f():\n    from sqlalchemy.engine import make_url\n"
        "if TYPE_CHECKING:\n    import openai\n"
    )
    assert _external(source) == {"typing", "sqlite3", "sqlalchemy"}
    externals = {
        "durable_agent.store.a": {"sqlalchemy"},
        "durable_agent.ui.b": {"sqlite3"},
        "durable_agent.worker": {"sqlalchemy", "msgspec"},
    }
    names = {"sqlalchemy", "sqlite3"}
    assert _importers(externals, names, "durable_agent.store", set()) == (
        ["durable_agent.ui.b", "durable_agent.worker"],
        set(),
    )
    known = {"durable_agent.ui.b", "durable_agent.ui.c"}
    assert _importers(externals, names, "durable_agent.store", known) == (
        ["durable_agent.worker"],
        {"durable_agent.ui.c"},
    )


# -- extras load only when used ---------------------------------------------------------------
EXTRAS = ("starlette", "uvicorn", "mcp")


def _loaded_extras(argv: list[str], cwd: Path, env: dict[str, str], before: str = "") -> list[str]:
    """The modules of the optional extras a CLI process had loaded when it exited."""
    out = cwd / "modules.json"
    program = (
        "import atexit, json, sys\n"
        f"{before}\n"
        "def report():\n"
        f"    names = sorted(m for m in sys.modules if m.split('.')[0] in {EXTRAS!r})\n"
        f"    open({str(out)!r}, 'w').write(json.dumps(names))\n"
        "atexit.register(report)\n"
        "from durable_agent.cli.parser import main\n"
        f"sys.argv = ['durable-agent', *{argv!r}]\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", program], cwd=cwd, env=env, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names: list[str] = json.loads(out.read_text())
    return names


@pytest.mark.parametrize(
    "argv", [["--help"], ["list"], ["start", "t", "--model", "SCRIPT", "--quiet"]]
)
def test_the_ui_and_mcp_extras_load_only_when_used(
    argv: list[str], env: dict[str, str], workspace: Path, write_script: object
) -> None:
    script = write_script([{"content": "done"}])  # type: ignore[operator]
    argv = [script if a == "SCRIPT" else a for a in argv]
    assert _loaded_extras(argv, workspace, env) == []


def test_the_extras_checker_sees_a_loaded_extra(env: dict[str, str], workspace: Path) -> None:
    assert "starlette" in _loaded_extras(["--help"], workspace, env, before="import starlette")


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
    """Comparisons of a step state, run status, approval decision, step kind or approval kind
    with a bare string (or a tuple of them, for `in`), and `decision="..."` / `kind="..."`
    keywords: these are spelt with their enums (store/records.py, status.py)."""
    from durable_agent.status import RunStatus, StepKind
    from durable_agent.store.records import ApprovalKind, Decision, StepState

    enums = (StepState, Decision, RunStatus, StepKind, ApprovalKind)
    values = {str(v) for enum in enums for v in enum}
    names = {"state", "status", "decision", "kind"}

    def named(node: ast.AST) -> bool:
        return (isinstance(node, ast.Attribute) and node.attr in names) or (
            isinstance(node, ast.Name) and node.id in names
        )

    def literal(node: ast.AST) -> bool:
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(literal(e) for e in node.elts)
        return isinstance(node, ast.Constant) and node.value in values

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any(named(s) for s in sides) and any(literal(s) for s in sides):
                found.append(ast.unparse(node))
        elif (
            isinstance(node, ast.keyword)
            and node.arg in ("decision", "kind")
            and literal(node.value)
        ):
            found.append(ast.unparse(node))
    return found


def test_states_kinds_and_decisions_are_enums_not_string_literals() -> None:
    found = {
        name: hits
        for name, path in _modules().items()
        if (hits := _state_literals(ast.parse(path.read_text())))
    }
    assert found == {}


def test_the_literal_checker_finds_them() -> None:
    tree = ast.parse(
        'if s.state == "started" or "denied" != decision: f(decision="approved")\n'
        'ok = s.state == StepState.STARTED and s.kind == "model"\n'
        'tool = e.kind in ("tool", "verify") or kind != StepKind.TOOL\n'
        'ask(kind="uncertain_side_effect", name="model")\n'
        "fine = entry.kind == DIR and a.kind == ApprovalKind.WORKSPACE_DRIFT"
    )
    assert sorted(_state_literals(tree)) == sorted(
        [
            "s.state == 'started'",
            "'denied' != decision",
            "s.kind == 'model'",
            "e.kind in ('tool', 'verify')",
            "decision='approved'",
            "kind='uncertain_side_effect'",
        ]
    )


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
