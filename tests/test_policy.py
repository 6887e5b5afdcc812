"""Rules: decisions by table, the command parser against bash itself, examples checked at
load, layers combined (strictest wins), MCP and plugin tool names."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path
from typing import Any

import forked_cli
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from durable_agent.config.command_words import simple_commands
from durable_agent.config.policy import PolicyInput, Rule, Verdict, decide

RULES = [
    Rule(decision=Verdict.DENY, command=["git", "push"], source="team.toml"),
    Rule(decision=Verdict.ALLOW, command=["git", "push"], source="me.toml"),
    Rule(decision=Verdict.ALLOW, command=["make", "build"]),
    Rule(decision=Verdict.ASK, regex=r"^curl .*example\.com"),
    Rule(decision=Verdict.DENY, tool="write_file", path="secrets/**"),
    Rule(decision=Verdict.ASK, tool="github__*", arguments={"repo": "prod-*"}),
    Rule(decision=Verdict.ALLOW, tool="github__list_*"),
    Rule(decision=Verdict.DENY, tool="deploy_tool", arguments={"target.env": "production"}),
    Rule(decision=Verdict.ALLOW, command=["rm"]),
]

# (tool, arguments, --shell, exec tool, expected)
TABLE: list[tuple[str, Any, str, bool, Verdict]] = [
    ("run_command", {"command": "git push origin main"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "git status && git push"}, "ask", True, Verdict.DENY),
    ("run_command", {"command": "echo $(git push)"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "bash -c 'cd x; git push -f'"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "sudo git push"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "bash -lc 'git push'"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "sh -euo pipefail -c 'git push'"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "bash --norc -c -- 'git push'"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "bash -c -e 'git push'"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "$'\\x67it' $'\\160\\u0075sh'"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": '$"git" push'}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "{git,push}"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "git pu{s,}h"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "{g..g}it push"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "{,git} push"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "{" + "," * 5000 + "git} push"}, "allow", True, Verdict.DENY),
    ("run_command", {"command": "'{git,push}'"}, "allow", True, Verdict.ALLOW),  # quoted
    ("run_command", {"command": "bash -e 'git push'"}, "allow", True, Verdict.ALLOW),  # a file
    ("run_command", {"command": "git pushy"}, "allow", True, Verdict.ALLOW),
    ("run_command", {"command": "'git push'"}, "allow", True, Verdict.ALLOW),  # one word
    ("run_command", {"command": "make build"}, "ask", True, Verdict.ALLOW),
    ("run_command", {"command": "make build && make deploy"}, "ask", True, Verdict.ASK),
    ("run_command", {"command": "make build; ls"}, "ask", True, Verdict.ALLOW),
    ("run_command", {"command": "make test"}, "deny", True, Verdict.DENY),
    ("run_command", {"command": "curl https://example.com/x"}, "allow", True, Verdict.ASK),
    ("run_command", {"command": "rm -rf build"}, "ask", True, Verdict.ALLOW),  # a rule says so
    ("run_command", {"command": "rmdir build"}, "ask", True, Verdict.ASK),  # default
    ("run_command", {"command": "ls"}, "ask", True, Verdict.ALLOW),  # allowlist, as before
    ("run_command", {"command": "git status '"}, "ask", True, Verdict.ASK),  # unparsable
    ("write_file", {"path": "secrets/a/key.pem"}, "allow", False, Verdict.DENY),
    ("write_file", {"path": "./secrets/key"}, "allow", False, Verdict.DENY),
    ("write_file", {"path": "src/secrets/key"}, "allow", False, Verdict.ALLOW),
    ("read_file", {"path": "secrets/key"}, "allow", False, Verdict.ALLOW),
    ("github__create_issue", {"repo": "prod-api"}, "allow", True, Verdict.ASK),
    ("github__create_issue", {"repo": "sandbox"}, "ask", True, Verdict.ASK),  # exec default
    ("github__create_issue", {"repo": "sandbox"}, "allow", True, Verdict.ALLOW),
    ("github__list_repos", {"repo": "prod-api"}, "ask", True, Verdict.ASK),  # strictest
    ("github__list_repos", {"repo": "x"}, "ask", True, Verdict.ALLOW),
    ("deploy_tool", {"target": {"env": "production"}}, "allow", True, Verdict.DENY),
    ("deploy_tool", {"target": {"env": "staging"}}, "allow", True, Verdict.ALLOW),
]


@pytest.mark.parametrize(("tool", "arguments", "shell", "exec_tool", "expected"), TABLE)
def test_decisions(
    tool: str, arguments: Any, shell: Any, exec_tool: bool, expected: Verdict
) -> None:
    policy = PolicyInput(rules=RULES, shell=shell, exec_tool=exec_tool)
    decision = decide(policy, tool, arguments)
    assert decision.verdict is expected, decision.explain()


def test_the_explanation_names_the_rule_and_its_file() -> None:
    decision = decide(PolicyInput(rules=RULES), "run_command", {"command": "git push"})
    text = decision.explain()
    assert "#1 deny" in text and "(team.toml)" in text and "#2 allow" in text
    assert "team.toml" in decision.reason


# -- the parser against bash's own word splitting ------------------------------------------
PLAIN = st.text("abcxyz019._/-+=,:@%", min_size=1, max_size=6)
ANY = st.text("ab z;&|<>()'\"\\$*#!{}~", min_size=1, max_size=6)


def _single(w: str) -> str | None:
    return None if "'" in w else f"'{w}'"


def _double(w: str) -> str:
    return '"' + "".join("\\" + c if c in '"\\$`' else c for c in w) + '"'


def _backslashed(w: str) -> str:
    return "".join(c if c.isalnum() else "\\" + c for c in w)


def _ansi_c(w: str) -> str:
    """`$'…'` with every character but letters in one of C's escapes (hex, octal, \\u)."""
    spelled = (r"\x%02x", r"\%03o", r"\u%04x")
    return (
        "$'" + "".join(c if c.isalpha() else spelled[i % 3] % ord(c) for i, c in enumerate(w)) + "'"
    )


def _locale(w: str) -> str:
    return "$" + _double(w)  # $"…": translated by the locale's catalog, of which bash has none


@st.composite
def word(draw: Any) -> tuple[str, str]:
    """(the word, as written in one of bash's quotings, or pieces of several)."""
    pieces = draw(
        st.lists(
            st.one_of(PLAIN.map(lambda w: (w, "plain")), ANY.map(lambda w: (w, "q"))),
            min_size=1,
            max_size=3,
        )
    )
    out = []
    for text, kind in pieces:
        styles = [_double, _backslashed, _ansi_c, _locale] + ([_single] if "'" not in text else [])
        if kind == "plain" and text[0] not in "=":
            styles.append(lambda w: w)
            styles.append(lambda w: f"{{{w},{w[::-1]}}}")  # brace expansion: two words
            styles.append(lambda w: f"{w[:1]}{{{w[1:]},}}{{1..{len(w)}}}")
        out.append(draw(st.sampled_from(styles))(text))
    return "".join(t for t, _ in pieces), "".join(out)


@st.composite
def command_line(draw: Any, depth: int = 0) -> tuple[str, list[list[str]]]:
    """A line of simple commands (t: true, f: false, both print their words), joined by
    ;, &&, ||, | so that each runs; with $( ) and bash -c inside."""
    n = draw(st.integers(1, 3))
    parts: list[str] = []
    expected: list[list[str]] = []
    for i in range(n):
        op = draw(st.sampled_from([";", "&&", "||", "|", "\n"])) if i < n - 1 else ""
        name = "f" if op == "||" else "t"
        words = [name]
        written = [name]
        inner: list[list[str]] = []
        for _ in range(draw(st.integers(0, 3))):
            kind = (
                draw(st.sampled_from(["word", "word", "word", "subst", "qsubst"]))
                if depth < 1
                else "word"
            )
            if kind == "word":
                w, shown = draw(word())
                words.append(w)
                written.append(shown)
            else:
                line, cmds = draw(command_line(depth + 1))
                written.append(f"$({line})" if kind == "subst" else f'"$({line})"')
                inner += cmds
        if depth < 1 and draw(st.booleans()) and len(written) > 1:
            body = " ".join(written)
            shell = draw(st.sampled_from(["bash", "/bin/bash"]))
            # the body is the first word after the options, wherever -c is among them
            flags = draw(st.sampled_from(["-c", "-ec", "-c -e", "-o pipefail -c", "--norc -c --"]))
            parts.append(f"{shell} {flags} {shlex.quote(body)} {op}")
        else:
            parts.append(" ".join(written) + f" {op}")
        expected.append(words)
        expected += inner
    return " ".join(parts), expected


# Each command's record in ONE printf (one write to the O_APPEND file): the two sides of a
# pipeline run at once, and two writes each could interleave ("t\0t\0\x1e\x1e").
_PRINTER = (
    "t() { printf '%s\\0' \"${FUNCNAME[0]}\" \"$@\" $'\\036' >&3; return 0; }\n"
    "f() { printf '%s\\0' \"${FUNCNAME[0]}\" \"$@\" $'\\036' >&3; return 1; }\n"
    "export -f t f\n"
)


def bash_commands(line: str, tmp: Path) -> list[list[str]]:
    """The simple commands bash runs for `line`, each as its words (printed by the commands)."""
    out = tmp / "words"
    out.write_bytes(b"")
    proc = subprocess.run(
        ["bash", "-c", 'exec 3>>"$OUT"\n' + _PRINTER + line],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        env={"PATH": os.environ["PATH"], "OUT": str(out)},
        timeout=10,
    )
    assert proc.returncode in (0, 1), proc.stderr
    records = [rec for rec in out.read_bytes().decode().split("\x1e\0") if rec]
    return [[w for w in rec.split("\0")[:-1] if w != ""] for rec in records]


@pytest.mark.slow  # over 2 s on 2 cores
@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=command_line())
@example(case=('t "\\$("")" ', [["t", "$()"]]))  # a literal `$()`, as bash prints it
def test_the_parser_splits_words_as_bash_does(
    case: tuple[str, list[list[str]]], tmp_path_factory: pytest.TempPathFactory
) -> None:
    line, _ = case

    def without_substitutions(commands: list[list[str]]) -> list[list[str]]:
        # A substitution's output (nothing here) is bash's, and the parser keeps it as its
        # text `$(...)`: such words are left out on both sides, since a word that merely
        # spells `$(...)` (`"\\$()"`) reads the same in both.
        return sorted(
            [w for w in words if not (w.startswith("$(") and w.endswith(")"))] for words in commands
        )

    # A pipeline's order is bash's: compare sets
    theirs = bash_commands(line, tmp_path_factory.mktemp("b"))
    assert without_substitutions(simple_commands(line)) == without_substitutions(theirs), line


def test_the_bash_oracle_sees_what_runs(tmp_path: Path) -> None:
    assert bash_commands("t 'a b' c; f x || t \"$(t in)\"", tmp_path) == [
        ["t", "a b", "c"],
        ["f", "x"],
        ["t", "in"],
        ["t"],
    ]


# -- loading ---------------------------------------------------------------------------------
def _check(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return forked_cli.run(["policy", "check", *args], env=env, cwd=cwd)


def test_examples_that_fail_are_a_one_line_error_at_load(
    env: dict[str, str], tmp_path: Path
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text(
        '[[rules]]\ndecision = "deny"\ncommand = ["rm", "-rf"]\nexamples_match = ["rm -r -f x"]\n'
    )
    proc = _check(env, tmp_path, "--rules", str(bad), "--", "ls")
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert "bad.toml" in proc.stderr and "'rm -r -f x' does not match" in proc.stderr
    bad.write_text('[[rules]]\ndecision = "ask"\ntool = "fs__*"\nexamples_not_match = [{}]\n')
    proc = _check(env, tmp_path, "--rules", str(bad), "--", "ls")
    assert proc.returncode == 2 and "matches the rule (examples_not_match)" in proc.stderr
    proc = forked_cli.run(
        ["start", "x", "--rules", str(bad), "--model", "demo"], env=env, cwd=tmp_path
    )
    assert proc.returncode == 2 and "examples_not_match" in proc.stderr


def test_rules_from_three_layers_combine_and_the_strictest_wins(
    env: dict[str, str], tmp_path: Path
) -> None:
    user = Path(env["XDG_CONFIG_HOME"]) / "durable-agent" / "config.toml"
    user.parent.mkdir(parents=True)
    user.write_text('[[rules]]\ndecision = "allow"\ncommand = ["git"]\n')
    team = tmp_path / "team.toml"
    team.write_text('[[rules]]\ndecision = "ask"\ncommand = ["git", "push"]\n')
    mine = tmp_path / "mine.toml"
    mine.write_text('[[rules]]\ndecision = "deny"\ncommand = ["git", "push", "--force"]\n')
    layers = ["--rules", str(team), "--rules", str(mine)]
    out = _check(env, tmp_path, *layers, "--", "git", "push", "--force").stdout
    assert "decision: deny" in out
    assert str(user) in out and str(team) in out and str(mine) in out
    out = _check(env, tmp_path, *layers, "--", "git push origin").stdout
    assert "decision: ask" in out and str(mine) not in out
    out = _check(env, tmp_path, *layers, "--", "git log").stdout
    assert "decision: allow" in out and f"({user})" in out


def test_mcp_and_plugin_tool_names(env: dict[str, str], tmp_path: Path) -> None:
    rules = tmp_path / "r.toml"
    rules.write_text(
        '[[rules]]\ndecision = "deny"\ntool = "github__delete_*"\n'
        'examples_match = ["{}"]\n'
        '[[rules]]\ndecision = "allow"\ntool = "github__*"\n'
        '[[rules]]\ndecision = "ask"\ntool = "plugin_deploy"\narguments = { "env" = "prod*" }\n'
    )
    given = ["--rules", str(rules)]
    out = _check(env, tmp_path, *given, "--tool", "github__delete_repo", "--", "{}").stdout
    assert "decision: deny" in out
    out = _check(env, tmp_path, *given, "--tool", "github__list_issues", "--", "{}").stdout
    assert "decision: allow" in out
    out = _check(env, tmp_path, *given, "--tool", "plugin_deploy", "--", "env=production").stdout
    assert "decision: ask" in out and "#3 ask" in out
    out = _check(env, tmp_path, *given, "--tool", "plugin_deploy", "--", "env=dev").stdout
    assert "matched rules: none" in out


def test_a_path_rule_sees_the_file_the_tool_would_open(tmp_path: Path) -> None:
    (tmp_path / "secrets").mkdir()
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "k").symlink_to("../secrets/k")
    rules = [Rule(decision=Verdict.DENY, tool="write_file", path="secrets/**")]
    policy = PolicyInput(rules=rules, workspace=str(tmp_path))
    for path in (f"{tmp_path}/secrets/k", "docs/../secrets/k", "docs/k", "./secrets//k"):
        assert decide(policy, "write_file", {"path": path}).verdict is Verdict.DENY, path
    assert decide(policy, "write_file", {"path": "docs/other"}).verdict is Verdict.ALLOW
