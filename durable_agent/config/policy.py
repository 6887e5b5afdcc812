"""The one place that decides what a tool call may do: allow, ask a person, or deny.

    [[rules]]                       in any config layer, and in `--rules FILE`
    decision = "deny"               allow | ask | deny
    tool = "run_command"            a name or a glob: "fs__*", "github__create_issue"
    command = ["git", "push"]       run_command: a prefix of a simple command's words
    # regex = "curl .*\\| *sh"     run_command: a regular expression on a simple command
    # path = "secrets/**"          a tool with a `path` argument: a glob, workspace-relative
    # arguments = { "repo" = "prod-*" }   any tool: dotted paths into the arguments, a value or glob
    examples_match = ["git push origin main"]
    examples_not_match = ["git pushy"]

For run_command the line is split into its simple commands as bash would (command_words.py:
quotes, `;`, `&&`, `||`, `|`, `$( )` and `bash -c` bodies): each simple command gets the
strictest decision of the rules that match it, and the call the strictest of its commands
(deny > ask > allow). A simple command no rule matches is decided as it was before rules:
by `--shell` (allow; deny; ask: the allowlist and the destructive patterns of
shell_policy.py). Other tools: the strictest matching rule, else their effect class as
before (a read or write runs; an exec tool asks under `--shell ask` unless it declares
itself harmless).

Rules are policy, not containment: they decide who is asked. Every command runs in the OS
sandbox (os_sandbox.py) whatever the rules say.
"""

import fnmatch
import json
import os
import posixpath
import re
from collections.abc import Mapping, Sequence
from enum import StrEnum
from typing import Any, Literal

from msgspec import Struct, field
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from durable_agent.config.command_words import Unparsable, simple_commands, strip_wrappers
from durable_agent.config.shell_policy import DEFAULT_ALLOWLIST, DEFAULT_DESTRUCTIVE
from durable_agent.config.shell_policy import decide as shell_decide


class Verdict(StrEnum):
    ALLOW = "allow"
    ASK = "ask"
    DENY = "deny"


_STRICTNESS = {Verdict.ALLOW: 0, Verdict.ASK: 1, Verdict.DENY: 2}
COMMAND_TOOL = "run_command"
Example = str | dict[str, Any]


def strictest(decisions: Sequence[Verdict]) -> Verdict:
    return max(decisions, key=_STRICTNESS.__getitem__, default=Verdict.ALLOW)


class Rule(BaseModel):
    """One `[[rules]]` entry (docs/policy.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    decision: Verdict
    """allow: runs without asking; ask: a person approves it first; deny: refused."""
    tool: str = "*"
    """The tool's name or a glob of names (MCP tools are SERVER__TOOL)."""
    command: list[str] | None = None
    """run_command: the first words of a simple command, e.g. ["git", "push"]."""
    regex: str | None = None
    """run_command: a regular expression searched in each simple command (its words joined by spaces)."""
    path: str | None = None
    """A glob on the call's `path` argument, relative to the workspace (`**` spans folders)."""
    arguments: dict[str, Any] | None = None
    """Dotted paths into the call's arguments and the value (or, for text, glob) each must have."""
    reason: str | None = None
    """Said to the model (deny) or the person (ask) with the decision."""
    examples_match: list[Example] = []
    """Calls the rule must match, checked when the config loads."""
    examples_not_match: list[Example] = []
    """Calls the rule must not match, checked when the config loads."""
    source: str = ""
    """Where the rule was read (a file), filled in by the loader."""

    @field_validator("regex")
    @classmethod
    def _compiles(cls, pattern: str | None) -> str | None:
        if pattern is not None:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"not a regular expression: {pattern!r} ({exc})") from None
        return pattern

    @field_validator("command")
    @classmethod
    def _not_empty(cls, words: list[str] | None) -> list[str] | None:
        if words is not None and not words:
            raise ValueError("an empty command prefix matches every command: leave it out")
        return words

    @model_validator(mode="after")
    def _examples_hold(self) -> "Rule":
        for example in self.examples_match:
            if self.why(self.example_tool(), _example_arguments(self, example)) is None:
                raise ValueError(
                    f"rule {self.label()}{_where(self.source)}: example {_shown(example)} does not match the rule "
                    "(examples_match)"
                )
        for example in self.examples_not_match:
            if self.why(self.example_tool(), _example_arguments(self, example)) is not None:
                raise ValueError(
                    f"rule {self.label()}{_where(self.source)}: example {_shown(example)} matches the rule "
                    "(examples_not_match)"
                )
        return self

    def example_tool(self) -> str:
        """The tool an example is a call of: the rule's own, or run_command for a command rule."""
        if self.command is not None or self.regex is not None:
            return COMMAND_TOOL
        return self.tool if not _is_glob(self.tool) else self.tool.replace("*", "x")

    def label(self) -> str:
        what = [f"tool={self.tool}"]
        if self.command is not None:
            what.append(f"command={json.dumps(self.command)}")
        if self.regex is not None:
            what.append(f"regex={json.dumps(self.regex)}")
        if self.path is not None:
            what.append(f"path={json.dumps(self.path)}")
        if self.arguments is not None:
            what.append(f"arguments={json.dumps(self.arguments, sort_keys=True)}")
        return f"{self.decision.value} {' '.join(what)}"

    # -- matching --------------------------------------------------------------------------
    def why(
        self,
        tool: str,
        arguments: Any,
        words: list[str] | None = None,
        workspace: str | None = None,
    ) -> str | None:
        """Why this rule matches the call (or, with `words`, that simple command of it);
        None when it does not. `workspace`: a path is also matched as the file it names
        there (an absolute path, links resolved), as the file tools will open it."""
        if not fnmatch.fnmatchcase(tool, self.tool):
            return None
        said = [f"tool {tool}" if self.tool in (tool, "*") else f"tool {tool} is {self.tool}"]
        if self.command is not None or self.regex is not None:
            if tool != COMMAND_TOOL:
                return None
            commands = [words] if words is not None else _commands(arguments)
            hit = next((w for w in commands if self._command_matches(w)), None)
            if hit is None:
                return None
            said.append(
                f"`{' '.join(hit)}` "
                + ("starts with " if self.command else "matches ")
                + (" ".join(self.command) if self.command else f"/{self.regex}/")
            )
        if self.path is not None:
            path = arguments.get("path") if isinstance(arguments, Mapping) else None
            if not isinstance(path, str):
                return None
            pattern = self.path
            forms = [p for p in _path_forms(path, workspace) if _path_matches(p, pattern)]
            if not forms:
                return None
            seen = f" (as {forms[0]})" if forms[0] != path else ""
            said.append(f"path {path} is {pattern}{seen}")
        if self.arguments is not None:
            for dotted, wanted in self.arguments.items():
                found, value = _at(arguments, dotted)
                if not found or not _value_matches(value, wanted):
                    return None
                said.append(f"{dotted} = {json.dumps(value)}")
        return ", ".join(said)

    def _command_matches(self, words: list[str]) -> bool:
        for candidate in _forms(words):
            if self.command is not None and candidate[: len(self.command)] != self.command:
                continue
            if self.regex is not None and not re.search(self.regex, " ".join(candidate)):
                continue
            return True
        return False

    @property
    def per_command(self) -> bool:
        """Decides simple commands one by one (a prefix or a regex), not the whole call."""
        return self.command is not None or self.regex is not None


def _forms(words: list[str]) -> list[list[str]]:
    """A simple command as written, and without the wrappers it runs through (`sudo`, `env`,
    `NAME=value`): a rule on `rm` also matches `sudo rm`; one on `sudo` still matches."""
    bare = strip_wrappers(words)
    bare = [bare[0].rsplit("/", 1)[-1], *bare[1:]] if bare and "/" in bare[0] else bare
    return [words] if bare == words else [words, bare]


def _is_glob(text: str) -> bool:
    return any(c in text for c in "*?[")


def _path_forms(path: str, workspace: str | None) -> list[str]:
    """The path as given, normalized (`./a//b/../c` is `a/c`), and, with the workspace, as
    the file the tools would open: relative to the workspace, links resolved."""
    forms = [posixpath.normpath(path)]
    if workspace:
        root = os.path.realpath(workspace)
        real = os.path.realpath(os.path.join(root, path))
        if real.startswith(os.path.join(root, "")):
            forms.append(os.path.relpath(real, root))
    return list(dict.fromkeys(forms))


def _path_matches(rel: str, pattern: str) -> bool:
    """`pattern` against a workspace-relative path; `**` spans folders, `*` does not."""
    regex = ""
    i = 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            regex, i = regex + "(?:.*/)?", i + 3
        elif pattern.startswith("**", i):
            regex, i = regex + ".*", i + 2
        elif pattern[i] == "*":
            regex, i = regex + "[^/]*", i + 1
        elif pattern[i] == "?":
            regex, i = regex + "[^/]", i + 1
        else:
            regex, i = regex + re.escape(pattern[i]), i + 1
    return re.fullmatch(regex, rel) is not None


def _at(arguments: Any, dotted: str) -> tuple[bool, Any]:
    value = arguments
    for part in dotted.split("."):
        if isinstance(value, Mapping) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return False, None
    return True, value


def _value_matches(value: Any, wanted: Any) -> bool:
    if isinstance(wanted, str) and isinstance(value, str):
        return fnmatch.fnmatchcase(value, wanted)
    return bool(value == wanted)


def _commands(arguments: Any) -> list[list[str]]:
    line = arguments.get("command") if isinstance(arguments, Mapping) else arguments
    if not isinstance(line, str):
        return []
    try:
        return simple_commands(line)
    except Unparsable:
        return []


def _example_arguments(rule: Rule, example: Example) -> Any:
    """An example as a call's arguments: a table is the arguments; text is the command
    (a command rule), the path (a path rule), else the arguments as JSON."""
    if isinstance(example, dict):
        return example
    if rule.per_command:
        return {"command": example}
    if rule.path is not None:
        return {"path": example}
    try:
        return json.loads(example)
    except ValueError:
        return {"command": example}


def _where(source: str) -> str:
    return f" in {source}" if source else ""


def _shown(example: Example) -> str:
    return json.dumps(example) if isinstance(example, dict) else repr(example)


# -- hooks ---------------------------------------------------------------------------------
class HookEvent(StrEnum):
    SESSION_START = "session_start"
    PRE_TOOL = "pre_tool"
    POST_TOOL = "post_tool"
    PRE_COMPACT = "pre_compact"
    STOP = "stop"
    RESUME = "resume"


class Hook(BaseModel):
    """One `[[hooks]]` entry: a command run in the sandbox at an event (docs/policy.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    event: HookEvent
    """session_start, pre_tool, post_tool, pre_compact, stop or resume."""
    command: str = Field(min_length=1)
    """A shell command; gets a JSON document on stdin. Exit 2 blocks (pre_tool) or asks the
    model to go on (stop), with stderr as the reason; other non-zero exits are the hook's failure."""
    tool: str = "*"
    """pre_tool and post_tool: only for tools whose name matches this glob."""
    timeout_s: float = Field(60.0, gt=0)
    """Seconds the hook may run; past them it is killed (a failure of the hook)."""
    idempotent: bool = False
    """A hook cut off by a crash is run again on resume; otherwise a person is asked."""
    source: str = ""
    """Where the hook was read (a file), filled in by the loader."""


# -- deciding --------------------------------------------------------------------------------
class Matched(Struct, frozen=True):
    rule: int  # its index in the rules in force
    label: str
    source: str
    decision: Verdict
    why: str


class PolicyDecision(Struct):
    """What the policy says of one call, and everything that went into it."""

    verdict: Verdict
    reason: str  # one line, for the model (deny) or the person (ask)
    matched: list[Matched] = field(default_factory=list)
    default: str | None = None  # how what no rule matched was decided
    commands: list[list[str]] | None = None  # run_command: its simple commands

    def explain(self) -> str:
        """The decision for a person: the rules that matched, where, and why it is what it is."""
        lines = [f"decision: {self.verdict.value}"]
        if self.commands is not None:
            lines.append("simple commands:")
            lines += [f"  {json.dumps(c)}" for c in self.commands] or ["  (none)"]
        if self.matched:
            lines.append("matched rules:")
            for m in self.matched:
                lines.append(f"  #{m.rule + 1} {m.label}  ({m.source or 'settings'})")
                lines.append(f"      {m.why}")
        else:
            lines.append("matched rules: none")
        if self.default is not None:
            lines.append(f"default: {self.default}")
        lines.append(f"why: {self.reason}")
        return "\n".join(lines)


class PolicyInput(Struct, frozen=True):
    """What the decision depends on besides the call: the settings in force."""

    rules: Sequence[Rule] = ()
    shell: Literal["allow", "ask", "deny"] = "ask"
    allowlist: Sequence[str] = DEFAULT_ALLOWLIST
    always_ask: Sequence[str] = ()
    exec_tool: bool = False  # the tool's effect class is exec
    asks: bool = True  # an exec tool that does not declare itself harmless
    workspace: str | None = None  # where a `path` argument is, for path rules


def decide(policy: PolicyInput, tool: str, arguments: Any) -> PolicyDecision:
    """The decision for a call of `tool` with `arguments` (a dict, or text)."""
    if tool == COMMAND_TOOL:
        return _decide_command(policy, arguments)
    matched = [
        Matched(i, r.label(), r.source, r.decision, why)
        for i, r in enumerate(policy.rules)
        if (why := r.why(tool, arguments, workspace=policy.workspace)) is not None
    ]
    if matched:
        verdict = strictest([m.decision for m in matched])
        return PolicyDecision(verdict, _rule_reason(policy, matched, verdict), matched)
    if not policy.exec_tool:
        return PolicyDecision(
            Verdict.ALLOW,
            "no rule matched: its effect class runs unasked",
            [],
            "effect class (read or write): allow",
        )
    if policy.shell == "allow" or not policy.asks:
        why = "--shell allow" if policy.shell == "allow" else "the tool declares itself harmless"
        return PolicyDecision(Verdict.ALLOW, f"no rule matched: {why}", [], f"exec tool: {why}")
    return PolicyDecision(
        Verdict.ASK,
        f"{tool} runs a side effect",
        [],
        f"exec tool under --shell {policy.shell}: ask",
    )


def _decide_command(policy: PolicyInput, arguments: Any) -> PolicyDecision:
    args = arguments if isinstance(arguments, Mapping) else {"command": arguments}
    line = args.get("command")
    line = line if isinstance(line, str) else json.dumps(arguments)
    unparsable = ""
    try:
        commands: list[list[str]] | None = simple_commands(line)
    except Unparsable as exc:
        commands, unparsable = None, str(exc)
    # Rules without a command pattern decide the whole call, every simple command of it.
    whole = _matching(policy, args, lambda r: not r.per_command)
    matched, verdicts, unmatched = list(whole), [m.decision for m in whole], []
    for words in commands or []:
        here = _matching(policy, args, lambda r: r.per_command, words)
        matched += here
        if here:
            verdicts.append(strictest([m.decision for m in here]))
        elif not whole:
            unmatched.append(words)
    rest = None  # what no rule decides: decided as before rules, by --shell and the allowlist
    if not whole and (not commands or len(unmatched) == len(commands)):
        rest = line
    elif unmatched:
        rest = "; ".join(_joined(w) for w in unmatched)  # the rules' allow covers their own only
    default = None
    if rest is not None:
        shell, why = shell_decide(
            rest, policy.shell, policy.allowlist, (*DEFAULT_DESTRUCTIVE, *policy.always_ask)
        )
        verdicts.append(Verdict(shell.value))
        where = f" (the line does not parse: {unparsable})" if commands is None else ""
        default = f"--shell {policy.shell}{where} on `{rest}`: {shell.value} ({why})"
        if not matched:
            return PolicyDecision(Verdict(shell.value), why, [], default, commands)
    verdict = strictest(verdicts)
    reason = _rule_reason(policy, matched, verdict, default)
    return PolicyDecision(verdict, reason, matched, default, commands)


def _matching(
    policy: PolicyInput, args: Any, which: Any, words: list[str] | None = None
) -> list[Matched]:
    return [
        Matched(i, r.label(), r.source, r.decision, why)
        for i, r in enumerate(policy.rules)
        if which(r) and (why := r.why(COMMAND_TOOL, args, words, policy.workspace)) is not None
    ]


def _joined(words: list[str]) -> str:
    import shlex

    return shlex.join(words)


def _rule_reason(
    policy: PolicyInput, matched: list[Matched], verdict: Verdict, default: str | None = None
) -> str:
    deciding = [m for m in matched if m.decision is verdict]
    if not deciding and default is not None:
        return default
    first = deciding[0] if deciding else matched[0]
    text = policy.rules[first.rule].reason
    where = f" in {first.source}" if first.source else ""
    said = f"rule #{first.rule + 1}{where} ({first.label}): {first.why}"
    return f"{text} [{said}]" if text else said
