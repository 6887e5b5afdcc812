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
from collections.abc import Mapping
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
    "DURABLE_AGENT_MODEL": "model",
    "DURABLE_AGENT_DB": "db",
    "DURABLE_AGENT_SANDBOX": "sandbox",
}


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
    base: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """config file < environment < `base` (a run's recorded settings) < flags; the store URL
    defaulted. Not validated. The `models` and `prices` tables merge by model."""
    merged: dict[str, Any] = {}
    if path is not None:
        add_layer(merged, read_config_file(path), str(path))
    for var, key in ENV_VARS.items():
        if env.get(var):
            merged[key] = env[var]
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
    for given in flags.get(RULES_FLAG) or ():  # `--rules FILE`: on top of every other layer's
        add_layer(merged, rules_file(Path(given)), str(given))
    merged.update({k: v for k, v in flags.items() if v is not None and k != RULES_FLAG})
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
