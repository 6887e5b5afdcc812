"""Which workspace files a snapshot never stores: those that hold a secret.

A file is withheld when its content holds a secret the harness knows (its API key, the
values of the credential-named variables it removes from commands: redact.is_secret_name)
or a key shape the redactor finds (unless `redact_observations` is off), and, by default,
when it is named as secrets conventionally are (.env*, *.pem, *.key, id_rsa*, .netrc, an
.npmrc holding a token...: the `snapshot_withhold_credential_files` setting). A link whose
target holds a secret is withheld too.

A withheld path is an entry of kind `secret` in the manifest: its hash, size and mode,
never its bytes (manifest.py). `diff` and the web view say it held a secret instead of
showing it; restore and fork leave what is on disk at its path as it is (materialize.py).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Mapping
from typing import Any

from durable_agent.redact import Redactor

# Names (of the file itself, compared in lower case) that hold secrets whatever is in them.
SECRET_NAMES = (
    b".env*",
    b"*.pem",
    b"*.key",
    b"*.p12",
    b"*.pfx",
    b"id_rsa*",
    b"id_dsa*",
    b"id_ecdsa*",
    b"id_ed25519*",
    b".netrc",
    b"_netrc",
    b".pgpass",
    b".git-credentials",
    b".htpasswd",
)
# Package managers' files that hold a secret only when they hold a token or a password
# (an .npmrc with `registry=` alone is ordinary configuration).
TOKEN_FILES = (b".npmrc", b".yarnrc", b".yarnrc.yml", b".pypirc")
# One pattern for all the names: tried on every file a scan reads.
_SECRET_NAME = re.compile(b"|".join(fnmatch.translate(p.decode()).encode() for p in SECRET_NAMES))
_TOKEN_LINE = re.compile(
    rb"(?im)^[ \t]*[^#;\r\n]*?(?:auth|password|token)[\w\"']*[ \t]*[:=][ \t]*[^\s#;]"
)


def _shapes() -> tuple[tuple[bytes, ...], tuple[bytes, ...], tuple[bytes, ...]]:
    """SECRET_NAMES and TOKEN_FILES as the (prefixes, suffixes, whole names) a name has in
    lower case to be `named`: a fast test for a scan's C loop (_speedups.seeded), which
    leaves such a name to `named`."""
    prefixes, suffixes, names = [], [], []
    for pattern in SECRET_NAMES:
        inner = pattern.strip(b"*")
        if b"*" in inner or b"?" in inner or b"[" in inner or pattern.count(b"*") > 1:
            raise ValueError(f"a secret name of no known shape: {pattern!r}")
        if not pattern.startswith(b"*") and not pattern.endswith(b"*"):
            names.append(pattern)
        elif pattern.endswith(b"*"):
            prefixes.append(inner)
        else:
            suffixes.append(inner)
    return tuple(prefixes), tuple(suffixes), (*names, *TOKEN_FILES)


NAME_SHAPES = _shapes()

HELD = "held a secret; not stored"  # how diff, the web view and restore say it


class SecretCheck:
    """Decides, for one file (or link target) read by the scanner, whether it is withheld."""

    __slots__ = ("by_name", "key", "redactor")

    def __init__(self, redactor: Redactor, *, by_name: bool = True) -> None:
        self.redactor, self.by_name = redactor, by_name
        # Scanners are kept per check (scan.scanner_for): what they withheld is cached.
        self.key = f"{redactor.fingerprint}:{int(by_name)}"

    def holds(self, rel: bytes, data: bytes) -> bool:
        """`data`, the content of the file at `rel`, is not to be stored."""
        if self.by_name and named_secret(rel, data):
            return True
        return self.redactor.finds(data.decode("utf-8", "surrogateescape"))

    def named(self, rel: bytes) -> bool:
        """`rel` may be withheld by its name alone (a file not read is then read after all)."""
        name = rel.rsplit(b"/", 1)[-1].lower()
        return self.by_name and (_SECRET_NAME.match(name) is not None or name in TOKEN_FILES)

    def link_holds(self, target: bytes) -> bool:
        return self.redactor.finds(target.decode("utf-8", "surrogateescape"))


def named_secret(rel: bytes, data: bytes) -> bool:
    """`rel` is named as a secret file (a token file only when `data` holds a token)."""
    name = rel.rsplit(b"/", 1)[-1].lower()
    if _SECRET_NAME.match(name):
        return True
    return name in TOKEN_FILES and _TOKEN_LINE.search(data) is not None


def for_run(settings: Any, redactor: Redactor) -> SecretCheck:
    """The check of a run: what its redactor finds (the run's key, its environment's
    credentials, key shapes unless `redact_observations` is off)."""
    return SecretCheck(redactor, by_name=bool(settings.snapshot_withhold_credential_files))


def for_command(env: Mapping[str, str], recorded: Mapping[str, Any] | None) -> SecretCheck:
    """The check of `restore`/`fork` (which snapshot what they overwrite): the secrets this
    process knows (its environment, the config file's key) and the run's recorded settings."""
    from durable_agent.config.layers import default_config_path, read_config_file
    from durable_agent.errors import DurableAgentError

    extra: dict[str, str] = {}
    try:
        path = default_config_path(env)
        key = read_config_file(path).get("api_key") if path is not None else None
    except (DurableAgentError, OSError):  # a config file it cannot read holds nothing it knows
        key = None
    if isinstance(key, str):
        extra["api_key"] = key
    settings = recorded or {}
    redactor = Redactor.from_env(
        env, shapes=settings.get("redact_observations") is not False, extra=extra
    )
    return SecretCheck(
        redactor, by_name=settings.get("snapshot_withhold_credential_files") is not False
    )
