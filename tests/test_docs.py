"""The docs say what the code does (issue 17): every stop reason is in docs/schema.md, the
scripted-model format in docs/models.md is a script the loader accepts and the README links
to it, and Azure is documented next to the local servers."""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sqlite3
import tomllib
from pathlib import Path

from durable_agent.models.scripted import validate_script
from durable_agent.status import STATUS_FOR_REASON, StopReason

ROOT = Path(__file__).resolve().parent.parent
MODELS = (ROOT / "docs" / "models.md").read_text()
README = (ROOT / "README.md").read_text()


def test_the_readme_is_short_opens_with_the_two_commands_and_shows_every_package() -> None:
    assert README.count("\n") < 200  # the history of figures lives in docs/performance.md
    first = README[README.index("```sh\n") : README.index("```\n", README.index("```sh\n") + 5)]
    assert "durable-agent demo" in first and "scripts/test" in first
    layout = README[README.index("## Layout") :]
    packages = sorted(p.parent.name for p in (ROOT / "durable_agent").glob("*/__init__.py"))
    assert packages and [p for p in packages if f"durable_agent/{p}/" not in layout] == []
    assert "[docs/performance.md](docs/performance.md)" in README


def test_every_stop_reason_is_documented_with_a_status() -> None:
    schema = (ROOT / "docs" / "schema.md").read_text()
    for reason in StopReason:
        assert f"`{reason.value}`" in schema, reason
        assert reason in STATUS_FOR_REASON
    assert "`empty_answer`" in README


def test_the_scripted_model_example_is_a_valid_script_and_readme_links_it() -> None:
    section = MODELS[MODELS.index("### Scripted models") :]
    section = section[: section.index("\n### ", 5)]
    (example,) = re.findall(r"```json\n(.*?)```", section, re.S)
    turns = validate_script(json.loads(example), "docs/models.md")
    assert any("tool_calls" in t for t in turns) and "content" in turns[-1]
    assert "docs/models.md#scripted-models---model-scriptedpath" in README


def test_azure_is_documented_next_to_the_local_servers() -> None:
    assert MODELS.index("### Azure OpenAI") > MODELS.index("| llama.cpp")
    assert "--api-type azure" in MODELS and "api-key" in MODELS and "api_version" in MODELS


def test_the_readme_says_what_shell_ask_does_and_does_not_guarantee() -> None:
    text = " ".join(README.split())
    assert "anything destructive" not in text  # the old promise it cannot keep
    start = text.index("`--shell ask` (the default) is not the boundary")
    said = text[start : start + 1200]
    assert "What it does guarantee:" in said and "What it does not guarantee:" in said
    assert "sandbox" in said and "it is a lexer, not a shell" in said


def test_the_readme_and_models_doc_name_model_calls_and_answers_that_are_not_final() -> None:
    text, models = " ".join(README.split()), " ".join(MODELS.split())
    assert "`6 model calls · 11 steps · 5 tool calls · ...`" in text
    assert "resuming from model call 6" in text and "`MODEL CALLS`" in text
    for words in (
        "cut off at the length limit, told to continue",
        "empty answer, told to answer",
        "~989+8",
    ):
        assert words in text and words in models, words


# -- Every command, flag, link, setting and column the docs name exists -----------------------

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
# Flags in backticks that belong to other programs (servers, bwrap, pytest, git, scripts/test).
FOREIGN_FLAGS = {
    "--prefix",  # npm install --prefix
    "--basetemp",
    "--cap-drop",
    "--enable-auto-tool-choice",
    "--tool-call-parser",
    "--jinja",
    "--new-session",
    "--filter",
    "--fast",
    "--bare",
    "--porcelain",  # git status --porcelain
    "--cached",  # git diff-index --cached
    "--full-tree",  # git ls-tree --full-tree
}
# The benchmarks' own flags (scripts/bench*.py), which exist there.
BENCH_SOURCE = "".join(p.read_text() for p in sorted((ROOT / "scripts").glob("bench*.py")))
FOREIGN_FLAGS |= set(re.findall(r'add_argument\(\s*"(--[a-z][a-z-]*)"', BENCH_SOURCE))


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    from durable_agent.cli.parser import build_parser

    parser = build_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    found = dict(sub.choices)
    for name, p in sub.choices.items():  # `mcp add`: its own flags, under `mcp add`
        for nested in [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]:
            found.update({f"{name} {n}": q for n, q in nested.choices.items()})
    return found


def _fenced_command_lines() -> list[tuple[str, list[str]]]:
    """`durable-agent ...` as a user would type it from the code blocks: continuations
    joined, comments dropped, `[--optional VALUE]` taken as given, one per `&&`/`|`/`;`."""
    found = []
    for doc in DOCS:
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", doc.read_text(), re.S | re.M):
            text = block.replace("\\\n", " ")
            text += "\n" + "\n".join(re.findall(r"\$\((durable-agent [^|)]*)", text))
            for line in text.splitlines():
                line = re.sub(r"\[(--[^\]]*)\]", r"\1", line.strip().removeprefix("$ "))
                if not re.match(r"(\S*/)?durable-agent |.*(&&|;) *(\S*/)?durable-agent ", line):
                    continue  # not a command line (a layout listing, output)
                tokens = shlex.split(line, comments=True)
                segment: list[str] = []
                for token in [*tokens, ";"]:
                    if token in ("&&", "|", ";", "||"):
                        if segment and segment[0].endswith("durable-agent"):
                            found.append((f"{doc.name}: {line}", segment[1:]))
                        segment = []
                    else:
                        segment.append(token)
    return found


def test_every_command_line_in_the_code_blocks_parses_with_the_real_parser() -> None:
    from durable_agent.cli.parser import build_parser

    lines = _fenced_command_lines()
    assert len(lines) >= 20 and any(args[:1] == ["worker"] for _, args in lines)
    bad = []
    for where, args in lines:
        try:
            build_parser().parse_args(args)
        except SystemExit:
            bad.append(where)
    assert not bad, bad


def test_every_inline_command_names_a_subcommand_and_only_its_own_flags() -> None:
    parsers = _subparsers()
    names = "|".join(parsers)
    checked, bad = 0, []
    for doc in DOCS:
        text = doc.read_text()
        spans = re.findall(r"`durable-agent ([^`]+)`", text) + re.findall(
            rf"`((?:{names}) (?:--|\.\.\. )[^`]*)`", text
        )
        for span in spans:
            words = span.split()
            if words[0].startswith("-") or words[0].endswith(":") or "\\|" in span:
                continue  # `durable-agent --help`, an output line, `db upgrade \| current \| path`
            checked += 1
            if words[0] not in parsers:
                bad.append(f"{doc.name}: {span} (no such command)")
                continue
            both = " ".join(words[:2])
            known = parsers[both if both in parsers else words[0]]._option_string_actions
            tokens = shlex.split(span)  # a quoted argument's own flags are not ours
            if "--" in tokens:  # what follows is another program's (`mcp add NAME -- CMD`)
                tokens = tokens[: tokens.index("--")]
            bad += [
                f"{doc.name}: {span} ({token})"
                for token in tokens
                if token.startswith("--") and token.split("=")[0] not in known
            ]
    assert checked > 40 and not bad, bad


def test_every_flag_in_backticks_exists_or_belongs_to_another_program() -> None:
    known = {flag for p in _subparsers().values() for flag in p._option_string_actions}
    bad = {
        (doc.name, flag)
        for doc in DOCS
        for span in re.findall(r"`([^`\n]+)`", doc.read_text())
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z-]*", span)
        if flag not in known | FOREIGN_FLAGS
    }
    assert not bad, sorted(bad)


def test_the_readme_lists_every_flag_of_start_and_resume_help_matches_the_table() -> None:
    parsers = _subparsers()
    flags_of_start = README[
        README.index("Flags of `start`:") : README.index("Output: the timeline")
    ]
    missing = [
        f
        for f in parsers["start"]._option_string_actions
        if f.startswith("--") and f != "--help" and f"`{f}" not in flags_of_start
    ]
    assert not missing, missing
    table = README[README.index("## Commands") : README.index("Flags of `start`:")]
    commands = {name for name in parsers if " " not in name}  # not `mcp add`
    first_cells = "\n".join(re.findall(r"^\| (.*?) \| ", table, re.M))
    assert set(re.findall(r"`durable-agent (\w+)", first_cells)) | {"show"} == commands


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_and_its_anchor_resolves() -> None:
    checked, bad = 0, []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", doc.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            checked += 1
            path, _, anchor = target.partition("#")
            file = (doc.parent / path).resolve() if path else doc
            if not file.exists():
                bad.append(f"{doc.name}: {target}")
            elif anchor and anchor not in {
                _slug(h) for h in re.findall(r"^#+ (.*)$", file.read_text(), re.M)
            }:
                bad.append(f"{doc.name}: {target} (no such heading)")
    assert checked > 15 and not bad, bad


def test_every_toml_block_of_the_docs_is_accepted_by_the_settings() -> None:
    from durable_agent.config.settings import Settings

    blocks = [
        b
        for doc in DOCS
        for b in re.findall(r"```toml\n(.*?)```", doc.read_text(), re.S)
        if "[project." not in b
    ]  # a plugin's own pyproject.toml
    assert len(blocks) >= 4
    for block in blocks:
        Settings(**tomllib.loads(block))


def test_the_schema_doc_names_every_column_of_every_table_and_view(cli, db_path: Path) -> None:  # type: ignore[no-untyped-def]
    assert cli("db", "upgrade").code == 0
    revision = cli("db", "current").stdout.strip()  # what the docs show `db current` print
    shown = [
        r for doc in DOCS for r in re.findall(r"durable-agent db current +# (\S+)", doc.read_text())
    ]
    assert shown and set(shown) == {revision}, (shown, revision)
    schema = (ROOT / "docs" / "schema.md").read_text()
    db = sqlite3.connect(db_path)
    objects = [
        name
        for (name,) in db.execute(
            "SELECT name FROM sqlite_master WHERE type IN ('table', 'view') "
            "AND name NOT LIKE 'sqlite_%' AND name != 'alembic_version'"
        )
    ]
    assert {
        "runs",
        "steps",
        "messages",
        "approvals",
        "run_timeline",
        "tool_calls",
        "run_totals",
    } <= set(objects)
    sections = re.split(r"\n(?=## |`\w+` — )", schema)
    views = dict(re.findall(r"^\| `(\w+)` \| [^|]+ \| (.*) \|$", schema, re.M))
    for name in objects:
        columns = {row[1] for row in db.execute(f"PRAGMA table_info({name})")}
        if name in views:
            documented = set(re.findall(r"`(\w+)`", views[name]))
            assert columns <= documented, (name, columns - documented)
            continue
        (section,) = [s for s in sections if re.match(rf"(## )?`{name}` —", s)]
        assert set(re.findall(r"^\| `(\w+)` \|", section, re.M)) == columns, name


def test_every_command_explains_itself_in_its_help() -> None:
    """`durable-agent CMD --help` says what CMD does, not only its usage line."""
    from durable_agent.cli.parser import EPILOG

    for name, parser in _subparsers().items():
        assert parser.description and len(parser.description) > 40, name
    for var in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "OPENAI_API_VERSION",
        "DURABLE_AGENT_MODEL",
        "DURABLE_AGENT_DB",
        "DURABLE_AGENT_SANDBOX",
        "DURABLE_AGENT_CONFIG",
    ):
        assert var in EPILOG and var in README, var
