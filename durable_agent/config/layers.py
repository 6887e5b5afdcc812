"""Where settings come from, without validating them: the config file, the environment,
the store's default location — and the few settings a store-only command needs.

`settings.load_settings` merges these layers into the whole `Settings` (pydantic). The
commands that only read or answer the store (`list`, `show`, `cancel`, `approve`,
`export`, `diff`) need four of them: store_settings.py merges the same layers for just
those, so those commands answer in about the time it takes to import SQLAlchemy (no
pydantic, no model of sixty settings to build).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from durable_agent.errors import ConfigError
from durable_agent.store.location import (  # the store's own reading of its URL, used here too
    in_memory as in_memory,
)
from durable_agent.store.location import (
    sqlite_file as sqlite_file,
)
from durable_agent.store.location import (
    sqlite_target as sqlite_target,
)
from durable_agent.store.location import (
    sqlite_url as sqlite_url,
)
from durable_agent.store.location import (
    store_files as store_files,
)
from durable_agent.store.location import (
    uri_flag as uri_flag,
)

ENV_VARS = {
    "OPENAI_API_KEY": "api_key",
    "OPENAI_BASE_URL": "base_url",
    "OPENAI_API_VERSION": "api_version",
    # Text settings read without the settings model (store-only commands stay light).
    "DURABLE_AGENT_MODEL": "model",
    "DURABLE_AGENT_DB": "db",
    "DURABLE_AGENT_SANDBOX": "sandbox",
    "DURABLE_AGENT_DURABILITY": "durability",
}
ENV_PREFIX = "DURABLE_AGENT_"  # DURABLE_AGENT_<SETTING>: every setting, by its upper-case name
# DURABLE_AGENT_* variables that are not settings: the config file's path, the web view's
# token, what every command a run starts is given, and the test suites' and scripts' knobs.
# Any other DURABLE_AGENT_* name that is no setting is a warning, never silently ignored.
OTHER_VARS = frozenset(
    {
        "DURABLE_AGENT_CONFIG",
        "DURABLE_AGENT_UI_TOKEN",
        "DURABLE_AGENT_RUN_ID",
        "DURABLE_AGENT_CALL_ID",
        "DURABLE_AGENT_NO_LANDLOCK",
        "DURABLE_AGENT_NO_OPENAT2",
        "DURABLE_AGENT_CRASH_AFTER",
        "DURABLE_AGENT_STOP_AFTER",
        "DURABLE_AGENT_FAULT_AT",
        "DURABLE_AGENT_FAULT",
        "DURABLE_AGENT_FAULT_REPEAT",
        "DURABLE_AGENT_FAULT_LOG",
        "DURABLE_AGENT_VENV",
        "DURABLE_AGENT_FLOORS_VENV",
    }
)
OTHER_PREFIXES = ("DURABLE_AGENT_TEST_",)
PROJECT_CONFIG = os.path.join(".durable-agent", "config.toml")
# What a repository's own .durable-agent/config.toml may not set: where the key goes (the
# endpoint), what contains commands, what they are given, which programs run outside the
# sandbox, where the store is. A cloned repository is not trusted with those; the user's
# config, the environment and the flags are.
NOT_FROM_PROJECT = (
    "workspace",
    "db",
    "api_key",
    "base_url",
    "api_type",
    "api_version",
    "sandbox",
    "network",
    "shell",
    # who is asked is the user's, as `shell` is: a repository's `shell_allowlist = ["sh"]`
    # was `shell = "allow"`; its `shell_always_ask = []` dropped the user's patterns; its
    # `on_uncertain_exec = "tell_model"` took the person out of a command cut off by a crash.
    "shell_allowlist",
    "shell_always_ask",
    "on_uncertain_exec",
    "command_env",
    "redact_observations",
    "snapshot_withhold_credential_files",
    # the user's promise: a repository's file must not move its files out of the store
    "snapshot_baseline",
    "tools",
    "mcp_servers",
    "mcp_config",
    "hooks",  # a cloned repository's file must not run commands of its own choosing
    "prices",  # nor price the user's models (a price of 0 turns max_cost off)
)
DEFAULT = "default"
_FLAGS = {"memory": "--no-memory", "mcp_servers": "--mcp"}  # where a flag's name is not the key
RECORDED = "the run's recorded settings"

_warned: set[str] = set()


def warn_once(text: str) -> None:
    """One line on stderr, once per process (the layers are merged more than once)."""
    if text not in _warned:
        _warned.add(text)
        import sys

        print(f"durable-agent: warning: {text}", file=sys.stderr)


def env_layer(
    env: Mapping[str, str], kinds: Callable[[], Mapping[str, str]]
) -> tuple[dict[str, Any], dict[str, str]]:
    """The settings the environment gives, and the variable each came from. An empty
    variable is unset (as `DURABLE_AGENT_DB=` always was); a DURABLE_AGENT_* name that is no
    setting is a warning. `kinds`: settings.setting_kinds, called only when a variable of
    ours is set (it builds the settings model)."""
    values: dict[str, Any] = {}
    where: dict[str, str] = {}
    for var, key in ENV_VARS.items():
        if env.get(var):
            values[key], where[key] = env[var], var
    names = sorted(
        v
        for v in env
        if v.startswith(ENV_PREFIX)
        and v not in ENV_VARS
        and v not in OTHER_VARS
        and not v.startswith(OTHER_PREFIXES)
    )
    if not names:
        return values, where
    known = kinds()
    for var in names:
        key = var[len(ENV_PREFIX) :].lower()
        if key not in known or var != ENV_PREFIX + key.upper():
            import difflib

            near = difflib.get_close_matches(key, list(known), n=1)
            hint = f" (did you mean {ENV_PREFIX}{near[0].upper()}?)" if near else ""
            warn_once(f"{var} is not a setting, ignored{hint}; `durable-agent config` lists them")
            continue
        if env[var] != "":
            values[key], where[key] = env_value(var, env[var], known[key]), var
    return values, where


def env_value(var: str, text: str, kind: str) -> Any:
    """A variable's text as the setting's value, typed as the TOML layer types it: text
    settings take it as it is; lists take a TOML array or comma-separated names; numbers,
    true/false and tables are read as a TOML value (what is not one stays text, for the
    settings' own check to say what is wrong with it)."""
    if kind == "text":
        return text
    import tomllib

    stripped = text.strip()
    if kind == "list" and not stripped.startswith("["):
        return [part.strip() for part in stripped.split(",") if part.strip()]
    try:
        return tomllib.loads(f"v = {stripped}")["v"]
    except tomllib.TOMLDecodeError as exc:
        if stripped.startswith(("[", "{")):
            raise ConfigError(f"{var}: not a TOML value ({exc})") from None
        return text


def project_config_path(workspace: str | os.PathLike[str]) -> Path | None:
    """The workspace's own `.durable-agent/config.toml`, when there is one."""
    candidate = Path(os.path.abspath(Path(workspace).expanduser())) / PROJECT_CONFIG
    try:
        os.stat(candidate)
    except OSError:
        return None
    return candidate


def _within(
    values: dict[str, Any], below: Mapping[str, Any], ceilings: Mapping[str, Any], path: Path
) -> dict[str, Any]:
    """A project file may lower a budget, never raise it past the user's (or the default):
    a repository does not decide how much of the user's money a run spends. `ceilings`:
    the budgets' defaults (None: unlimited)."""
    raised = []
    for key, default in ceilings.items():
        if key not in values:
            continue
        current, wanted = below.get(key, default), values[key]
        try:
            higher = current is not None and (wanted is None or float(wanted) > float(current))
        except (TypeError, ValueError):
            continue  # not a number: the settings model says so
        if higher:
            raised.append(key)
    if raised:
        warn_once(
            f"{path} raises {', '.join(raised)} above the user's or the default value, which "
            "only the user config, the environment or a flag may do: ignored"
        )
    return {k: v for k, v in values.items() if k not in raised}


def project_layer(path: Path) -> dict[str, Any]:
    """The project file's settings, without those only the user may set (warned of)."""
    values = read_config_file(path)
    refused = [k for k in NOT_FROM_PROJECT if k in values]
    if refused:
        warn_once(
            f"{path} sets {', '.join(refused)}, which only the user config, the environment "
            "or a flag may set: ignored"
        )
    kept = {k: v for k, v in values.items() if k not in refused}
    rules = kept.get("rules")
    if isinstance(rules, list):  # a repository may make its calls stricter, never looser
        loose = [r for r in rules if isinstance(r, dict) and r.get("decision") == "allow"]
        if loose:
            warn_once(
                f"{path} has {len(loose)} allow rule(s), which only the user config, the "
                "environment or --rules may hold: ignored"
            )
            kept["rules"] = [r for r in rules if r not in loose]
    return kept


def default_config_path(env: Mapping[str, str]) -> Path | None:
    if env.get("DURABLE_AGENT_CONFIG"):
        return Path(env["DURABLE_AGENT_CONFIG"]).expanduser()
    base = Path(env.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    candidate = base / "durable-agent" / "config.toml"
    try:
        os.stat(candidate)
    except FileNotFoundError:
        return None
    except OSError:  # a folder on the way the harness may not read: read_config_file says so
        pass
    return candidate


def default_db_url(env: Mapping[str, str]) -> str:
    base = Path(env.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return sqlite_url(base / "durable-agent" / "durable-agent.db")


def own_files(db: str, config: Path | None) -> tuple[str, ...]:
    """The harness's own files, real paths: its config file, the editors' copies of it and its
    folder; its SQLite store's files, and their folder too when it is the harness's own
    (`durable-agent`: other stores, logs)."""
    paths: list[str] = []
    if config is not None:
        paths.append(str(config))  # real path below: a config linked in from a dotfiles folder
        # Its folder, where the link is and where the file is: other configs, and the
        # editors' copies of this one (config.toml~, .config.toml.swp, config.toml.bak,
        # #config.toml#), which hold the same key. The sandbox hides a folder it can
        # (os_sandbox.hidden); where it cannot (it holds the workspace, the home folder),
        # the copies are hidden one by one, so they are listed too.
        for where in dict.fromkeys((config, Path(os.path.realpath(config)))):
            paths += _copies_of(where)
            paths.append(str(where.parent))
    files = store_files(db)
    if files:
        paths += files
        if Path(files[0]).parent.name == "durable-agent":
            paths.append(str(Path(files[0]).parent))
    return tuple(dict.fromkeys(os.path.realpath(p) for p in paths))


def _copies_of(config: Path) -> list[str]:
    """Files beside `config` whose names hold its name: an editor's backup, swap or lock."""
    try:
        with os.scandir(config.parent) as entries:
            # Not a link: hiding what it points to (a lock's dangling link, /etc/passwd) is
            # not hiding a copy of the config.
            return [
                e.path
                for e in entries
                if config.name in e.name
                and e.name != config.name
                and e.is_file(follow_symlinks=False)
            ]
    except OSError:
        return []


MAX_CONFIG_BYTES = 4 * 1024 * 1024


def read_config_file(path: Path) -> dict[str, Any]:
    import tomllib  # only when there is a file to read

    from durable_agent.capped import read_capped

    try:
        # Without blocking: a FIFO named as the config (with no writer) would hang every command.
        with open(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb") as f:
            st = os.fstat(f.fileno())
            mode = st.st_mode
            if stat.S_ISDIR(mode):
                raise IsADirectoryError(errno.EISDIR, "Is a directory")
            if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
                raise ConfigError(f"config file {path} is not a regular file")
            raw = read_capped(f, st.st_size, MAX_CONFIG_BYTES)
        if len(raw) > MAX_CONFIG_BYTES:  # /dev/zero, a log file named by mistake
            raise ConfigError(f"config file {path} is larger than {MAX_CONFIG_BYTES >> 20} MiB")
        data = tomllib.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file not found: {path}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(
            f"cannot read config file {path}: not UTF-8 text ({exc.reason} at byte {exc.start})"
        ) from None
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except RecursionError:
        raise ConfigError(f"cannot read config file {path}: nested too deeply") from None
    # Accept both a flat file and one with a [durable-agent] table, not both at once (the
    # keys beside the table were silently dropped).
    table = data.get("durable-agent", data)
    if not isinstance(table, dict):
        raise ConfigError(
            f"config file {path}: `durable-agent` must be a table ([durable-agent]), "
            f"not {type(table).__name__}"
        )
    if table is not data and len(data) > 1:
        beside = ", ".join(sorted(k for k in data if k != "durable-agent"))
        raise ConfigError(
            f"config file {path}: settings both beside and inside [durable-agent] "
            f"({beside}): put them all in one place"
        )
    return dict(table)


# Settings whose entries add up over the layers (user config, project config, `--rules FILE`)
# instead of the last layer replacing the list: each entry is marked with the file it came
# from (`policy check` and the run's recorded settings say where a rule was read). A run's
# recorded settings replace them whole: a resume keeps the rules it ran under.
ACCUMULATED = ("rules", "hooks")
RULES_FLAG = "rules_files"


def add_layer(merged: dict[str, Any], table: Mapping[str, Any], source: str) -> None:
    """One config layer over `merged`: its settings replace, its rules and hooks add up.
    Every layer that is a file goes through here (a project layer too)."""
    for key, value in table.items():
        if key in ACCUMULATED and isinstance(value, list):
            marked = [{**v, "source": source} if isinstance(v, dict) else v for v in value]
            earlier = merged.get(key)
            merged[key] = [*(earlier if isinstance(earlier, list) else []), *marked]
        else:
            merged[key] = value


def rules_file(path: Path) -> dict[str, Any]:
    """`--rules FILE`: a TOML file of `[[rules]]` and `[[hooks]]` only."""
    table = read_config_file(path)
    unknown = sorted(set(table) - set(ACCUMULATED))
    if unknown:
        raise ConfigError(
            f"rules file {path}: only [[rules]] and [[hooks]] belong here, not {', '.join(unknown)}"
        )
    return table


def merge_layers(
    flags: Mapping[str, Any],
    env: Mapping[str, str],
    *,
    path: Path | None,
    kinds: Callable[[], Mapping[str, str]],
    base: Mapping[str, Any] | None = None,
    sources: dict[str, str] | None = None,
    ceilings: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """user config file < project config (.durable-agent/config.toml in the workspace) <
    environment < `base` (a run's recorded settings) < flags; the store URL defaulted. Not
    validated. The `models` and `prices` tables merge by model. `sources`, when given, gets
    where each value came from (a file's path, a variable's name, `--flag`)."""
    merged: dict[str, Any] = {}
    where: dict[str, str] = {}
    user = read_config_file(path) if path is not None else {}
    add_layer(merged, user, str(path))
    where.update(dict.fromkeys(user, str(path)))
    from_env, env_where = env_layer(env, kinds)
    workspace: str | os.PathLike[str] = "."
    for layer in (flags, base or {}, from_env, user):  # as they take precedence below
        given = layer.get("workspace")
        if isinstance(given, str | os.PathLike) and given:
            workspace = given
            break
    project = project_config_path(workspace)
    if project is not None:
        values = _within(project_layer(project), merged, ceilings or {}, project)
        add_layer(merged, values, str(project))
        where.update(dict.fromkeys(values, str(project)))
    merged.update(from_env)
    where.update(env_where)
    if base:
        where.update({k: RECORDED for k, v in base.items() if v is not None})
    if base:
        for key, value in base.items():
            if value is None:
                continue
            if (
                key in ("models", "prices")
                and isinstance(value, dict)
                and isinstance(merged.get(key), dict)
            ):
                # The model a resume switches to (`resume --model BIGGER`, as a run that
                # cannot fit is told) takes its window and price from the config file when
                # the run recorded none; nothing else of the file's tables comes in: a model
                # the run used keeps what it ran with, and an edit about other models is no
                # change to this run.
                named = flags.get("model")
                if (
                    named not in (None, base.get("model"), base.get("compact_model"))
                    and named in merged[key]
                ):
                    value = {named: merged[key][named], **value}
            merged[key] = value
    for rules in flags.get(RULES_FLAG) or ():  # `--rules FILE`: on top of every other layer's
        add_layer(merged, rules_file(Path(rules)), str(rules))
    given = {k: v for k, v in flags.items() if v is not None and k != RULES_FLAG}
    merged.update(given)
    where.update({k: _FLAGS.get(k) or "--" + k.replace("_", "-") for k in given})
    if (
        project is not None
        and merged.get("shell") == "deny"
        and merged.get("verify")
        and where.get("verify") == str(project)
    ):
        # `--shell deny`: no command runs, and the repository's own check is a command the
        # user did not ask for (it is not the shell tool, so no approval would see it).
        warn_once(f"{project} sets verify, which does not run under --shell deny: ignored")
        del merged["verify"]
        del where["verify"]
    if sources is not None:
        sources.update(where)
    for key in ("db", "workspace"):  # used before pydantic checks the rest (a TypeError, else)
        if key in merged and not isinstance(merged[key], str | os.PathLike):
            raise ConfigError(
                f"invalid settings: {key} must be text (a path or URL), "
                f"not {type(merged[key]).__name__}"
            )
    if merged.get("db") == "":  # given, but empty (`--db ''`, `db = ""`): not "the default"
        raise ConfigError(
            "the store URL is empty: give --db a URL or a file path, or leave it out "
            "for the default store"
        )
    if merged.get("workspace") == "":  # `--workspace "$UNSET"`: not "the current directory"
        raise ConfigError(
            "the workspace is empty: give --workspace a directory, or leave it out "
            "for the current directory"
        )
    if not merged.get("db"):
        merged["db"] = default_db_url(env)
    elif in_memory(merged["db"]):
        raise ConfigError(
            f"the store {merged['db']} is in memory: it keeps nothing once this process "
            "ends, so no run there could be resumed or shown; give --db a file or a URL"
        )
    return merged
