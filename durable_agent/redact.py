"""Secret redaction for what is stored or sent to the model.

Two kinds of text, two rules (redaction never alters an effect):

- what the model asked to write or run (tool-call arguments) is an effect: only the
  exact values of the harness's own secrets are replaced (`redact_known`), everything
  else, key-shaped test fixtures included, is written and run byte for byte;
- observations (file contents, command output, errors) get both rules (`redact`), unless
  the run turns key shapes off (`redact_observations = false`, for trusted repositories).

Two sources of secrets:

- values of environment variables whose *names* say they are credentials
  (`OPENAI_API_KEY`, `GITHUB_TOKEN`, `DB_PASSWORD`, `MYSQL_PWD`, ...: `is_secret_name`, the
  same rule that keeps them from commands) -> `[REDACTED:NAME]`, so a
  reader can still tell which credential leaked into an output;
- well-known key *shapes* (OpenAI, Anthropic, GitHub, AWS, Slack, Google keys, JWTs,
  PEM private keys, `Bearer` tokens, passwords in URLs) -> `[REDACTED]`.

`Redactor.redact` runs on every stored message, so all of it is one precompiled
alternation: a single scan of the text, however many secrets there are. (A detector such
as detect-secrets was considered: its entropy plugins flag hashes and ids, which would
garble ordinary output, and its regex plugins cover the same shapes as below.)
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

T = TypeVar("T")
_ANY_ESCAPE = re.compile(r'\\(?:u([0-9a-fA-F]{4})|(["\\\\/bfnrt]))')
_SIMPLE_ESCAPES = {
    '"': '"',
    "\\": "\\",
    "/": "/",
    "b": "\b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
}
_NOT_JSON_WITH_SECRET = "[REDACTED] (arguments that were not JSON and held a secret)"
_UNCLEANABLE = "[REDACTED] (text that held a secret in a spelling too deep to clean)"
# A string of a valid JSON text, keys included (scanned from its start, outside any string).
# An unterminated one runs to the end of the text: a failed match retried at every later
# quote would make the scan quadratic.
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*(?:"|\Z)', re.DOTALL)

# A credential-looking name: any of these anywhere in the name (PASS: PASSWORD, PASSWD,
# PASSPHRASE, MYSQL_PASS...)...
_SECRET_NAME_PARTS = ("KEY", "TOKEN", "SECRET", "PASS", "CREDENTIAL", "PRIVATE")
# ...PWD anywhere (MYSQL_PWD, DB_PWD), but for the shell's own working-directory variables,
# which every shell sets and which hold a path, never a credential...
_PWD_NOT_SECRET = frozenset({"PWD", "OLDPWD"})
# ...AUTH anywhere (NPM_AUTH, OAUTH_CLIENT, AUTHORIZATION), but for AUTHOR (GIT_AUTHOR_NAME
# is not a secret, and its value would be redacted from every `git log`)...
_AUTH = re.compile(r"AUTH(?!OR(?!IZ))")
# ...or one of these as a whole `_`-separated word (as substrings they would also hit
# PATH and PATTERN: `GH_PAT` is a secret, `PYTHONPATH` is not).
_SECRET_NAME_WORDS = frozenset({"PAT", "COOKIE", "DSN"})

# Values too short or too common to redact: replacing every "true" or "1" in the
# output would destroy it without protecting anything.
MIN_SECRET_LENGTH = 6
_BORING_VALUES = frozenset(
    {
        "true",
        "false",
        "yes",
        "no",
        "none",
        "null",
        "unset",
        "changeme",
        "default",
        "enabled",
        "disabled",
    }
)

# Key shapes that must start at a token boundary, so identifiers that merely contain a
# prefix (`task-...` contains `sk-`) are left alone. The boundary is checked in
# `_replace`, not with a leading `\b` or lookbehind: a pattern whose every branch starts
# with a literal lets `re` jump from candidate to candidate instead of trying each one
# at every position (five times faster on ordinary text).
_BOUNDED_SHAPES = (
    # OpenAI (sk-..., sk-proj-..., sk-svcacct-...) and Anthropic (sk-ant-...) keys; a real
    # key has digits, kebab-case words like `sk-learn-model-selection-guide` do not.
    r"sk-(?=[\w-]*\d)[\w-]{20,}",
    r"gh[pousr]_[A-Za-z0-9]{30,}",  # GitHub classic tokens
    r"github_pat_\w{22,}",  # GitHub fine-grained tokens
    r"(?:AKIA|ASIA)[0-9A-Z]{16}\b",  # AWS access key ids
    r"xox[baprse]-[A-Za-z0-9-]{10,}",  # Slack
    r"AIza[\w-]{35}",  # Google API keys
    r"eyJ[\w-]{8,}\.eyJ[\w-]{8,}\.[\w-]{8,}",  # JWTs
    # Only the token is replaced, so the output still reads "Authorization: Bearer [REDACTED]".
    r"Bearer\s+(?P<bearer>[A-Za-z0-9._~+/=-]{8,})",
)
# Every shape above starts with one of these (checked by a test): text holding none of them
# and none of the known values cannot match, and `in` finds that at memchr speed, where the
# alternation tries its branches at every `s`, `e`, `g`... of ordinary output.
_SHAPE_PREFIXES = (
    "sk-",
    "ghp_",
    "gho_",
    "ghu_",
    "ghs_",
    "ghr_",
    "github_pat_",
    "AKIA",
    "ASIA",
    "xox",
    "AIza",
    "eyJ",
    "Bearer",
    "-----BEGIN ",
    "://",
)
_FREE_SHAPES = (
    # A PEM private key, up to its END line, or to the end of a truncated text.
    r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z0-9 ]*PRIVATE KEY-----|\Z)",
    # The password of a URL: postgres://me:[REDACTED]@db/app
    r"://[^\s/:@]+:(?P<urlpass>[^\s/@]+)@",
)


def is_secret_name(name: str) -> bool:
    """True for environment variable names that hold credentials (case-insensitive): any
    name containing KEY, TOKEN, SECRET, PASS, CREDENTIAL, PRIVATE, PWD (not PWD or OLDPWD
    themselves) or AUTH (not as AUTHOR), or with PAT, COOKIE or DSN as a word. Such a
    variable reaches no command unless named exactly in `command_env`, and its value is
    redacted wherever it appears."""
    upper = name.upper()
    if any(part in upper for part in _SECRET_NAME_PARTS):
        return True
    if "PWD" in upper and upper not in _PWD_NOT_SECRET:
        return True
    if "AUTH" in upper and _AUTH.search(upper):
        return True
    return any(word in _SECRET_NAME_WORDS for word in upper.split("_"))


def _worth_redacting(value: str) -> bool:
    value = value.strip()
    return len(value) >= MIN_SECRET_LENGTH and value.lower() not in _BORING_VALUES


class Redactor:
    """Replaces known secret values and key shapes in text.

    Build it once per process (`Redactor.from_env(os.environ)`) and reuse it: construction
    compiles the pattern, `redact` only scans.
    """

    __slots__ = ("_known", "_names", "_pattern", "_prefixes", "_shapes")

    def __init__(self, secrets: Mapping[str, str] | None = None, *, shapes: bool = True) -> None:
        """`secrets` maps a name to a secret value; every value is redacted as-is.
        `shapes=False`: `redact` replaces only those values, not key shapes."""
        names: dict[str, str] = {}
        for name, value in sorted((secrets or {}).items()):
            if value:
                names.setdefault(value, name)  # one value under two names: first name wins
        self._names, self._shapes = names, shapes
        # Longest first, so a secret that contains another is replaced whole.
        literals = sorted(names, key=len, reverse=True)
        parts = []
        if literals:
            parts.append("(?P<env>" + "|".join(re.escape(v) for v in literals) + ")")
        self._known = re.compile("|".join(parts)) if parts else None
        if shapes:
            parts.append("(?P<bounded>" + "|".join(_BOUNDED_SHAPES) + ")")
            parts.extend(_FREE_SHAPES)
        self._pattern = re.compile("|".join(parts)) if parts else None
        self._prefixes = tuple(literals) + (_SHAPE_PREFIXES if shapes else ())

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, shapes: bool = True, extra: Mapping[str, str] | None = None
    ) -> Redactor:
        """Redact the values of credential-named variables in `env` and the `extra` secrets
        (e.g. the configured API key), and key shapes unless `shapes` is False."""
        secrets = {
            name: value
            for name, value in env.items()
            if is_secret_name(name) and _worth_redacting(value)
        }
        secrets.update({k: v for k, v in (extra or {}).items() if _worth_redacting(v)})
        return cls(secrets, shapes=shapes)

    def _replace(self, match: re.Match[str]) -> str:
        group = match.lastgroup
        if group == "env":
            return f"[REDACTED:{self._names[match.group()]}]"
        if group == "bounded":
            start = match.start()
            if start and (match.string[start - 1].isalnum() or match.string[start - 1] in "_-"):
                return match.group()  # inside a longer word: not a key
            if match.group("bearer") is not None:
                return _replace_group(match, "bearer")
        elif group == "urlpass":
            return _replace_group(match, "urlpass")
        return "[REDACTED]"

    def finds(self, text: str) -> bool:
        """`text` holds something `redact` would replace (a known value, or a key shape
        unless shapes are off): what decides that a workspace file is never stored."""
        if self._pattern is None or not any(p in text for p in self._prefixes):
            return False
        return any(self._replace(m) != m.group() for m in self._pattern.finditer(text))

    @property
    def fingerprint(self) -> str:
        """Equal for two redactors that find the same things (a scanner per distinct set)."""

        digest = hashlib.sha256(b"shapes" if self._shapes else b"known")
        for value in sorted(self._names):
            digest.update(b"\0" + value.encode("utf-8", "surrogatepass"))
        return digest.hexdigest()

    def redact(self, text: str) -> str:
        """For observations: known secret values and (unless turned off) key shapes."""
        if self._pattern is None or not any(p in text for p in self._prefixes):
            return text
        return self._pattern.sub(self._replace, text)

    def redact_known(self, text: str) -> str:
        """For effects (what the model asked to write or run): only the exact values of the
        harness's own secrets, which must never reach a file, a command or the store."""
        return text if self._known is None else self._known.sub(self._replace, text)

    def redact_known_arguments(self, arguments: str) -> str:
        """`redact_known` for a tool call's JSON arguments: also a value spelt with escapes
        (`\\u0073k-...`), which the tool would receive decoded. Only a string that held a
        secret is written anew; every other byte stays as sent (numbers such as 1e400, key
        order, a key given twice)."""
        if self._known is None:
            return arguments
        text = self._known.sub(self._replace, arguments)
        if "\\" not in text:
            return text  # no escapes: nothing decodes to anything the pass above did not see
        try:
            json.loads(text)
        except (ValueError, RecursionError):
            # Not JSON (the call fails, but is stored and sent back): its escapes read as a
            # string's would be. Holding a secret, none of it is kept: any decoded spelling
            # could itself be JSON whose escapes decode to the secret once more.
            return _NOT_JSON_WITH_SECRET if self._escaped_secret(text) else text
        return _JSON_STRING.sub(self._known_in_string, text)

    def redact_known_escaped(self, text: str) -> str:
        """`redact_known` for a model's free text, which may carry JSON as written (the text
        protocol's TOOL_CALL lines, stored and sent back as they came): the secret spelt
        with JSON escapes too. A JSON string holding it is written anew; a spelling outside
        any (broken JSON) leaves the whole text decoded, redacted; one deeper than we look
        (ESCAPE_LEVELS), a marker."""
        if self._known is None or "\\" not in text or not self._escaped_secret(text):
            return text
        out = _JSON_STRING.sub(self._known_in_any_string, text)
        if not self._escaped_secret(out):
            return out
        # Decoded as far as the secret shows, and redacted there: decoding on would eat its
        # first letter into an escape (`\\` then `\u0074ok-...` is `\tok-...`, then a tab
        # and `ok-...`, which no longer matches). A spelling deeper still would come out one
        # level nearer.
        decoded = next(spelt for spelt in _spellings(text) if self._known.search(spelt))
        out = self._known.sub(self._replace, decoded)
        return _UNCLEANABLE if self._escaped_secret(out) else out

    def _escaped_secret(self, text: str) -> bool:
        """The secret in some decoding of `text`'s escapes (see _spellings)."""
        assert self._known is not None
        return any(self._known.search(spelt) for spelt in _spellings(text))

    def _known_in_any_string(self, match: re.Match[str]) -> str:
        try:
            return self._known_in_string(match)
        except ValueError:  # prose between quotes (or an unterminated one), not a JSON string
            return match.group()

    def _known_in_string(self, match: re.Match[str]) -> str:
        token = match.group()
        value = json.loads(token)
        cleaned = self.redact_known_escaped(
            self.redact_known(value)
        )  # a string holding JSON in turn
        return token if cleaned == value else json.dumps(cleaned, ensure_ascii=False)

    def redact_known_json(self, obj: T) -> T:
        """A copy of a JSON-like value with the harness's own secrets replaced in every
        string (keys included): for what the user configured (settings, commands of hooks
        and verification), which only those values must leave."""
        return self._walk(obj, self.redact_known)  # type: ignore[no-any-return]

    def redact_json(self, obj: T) -> T:
        """A copy of a JSON-like value with every string (keys included) redacted."""
        return self._redact_any(obj)  # type: ignore[no-any-return]

    def _redact_any(self, obj: Any) -> Any:
        return self._walk(obj, self.redact)

    def _walk(self, obj: Any, redact: Callable[[str], str]) -> Any:
        if isinstance(obj, str):
            return redact(obj)
        if isinstance(obj, dict):
            return {self._walk(k, redact): self._walk(v, redact) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._walk(v, redact) for v in obj]
        if isinstance(obj, tuple):
            return tuple(self._walk(v, redact) for v in obj)
        return obj


ESCAPE_LEVELS = 4  # decodings looked through; no reader here decodes more than twice


def _spellings(text: str) -> list[str]:
    """`text` and what decoding its JSON escapes again and again gives (a string holding
    JSON, as the text protocol's `input` may be, is decoded twice), up to ESCAPE_LEVELS."""
    out = [text]
    for _ in range(ESCAPE_LEVELS):
        if "\\" not in out[-1]:
            break
        out.append(_ANY_ESCAPE.sub(_unescape, out[-1]))
    return out


def _unescape(match: re.Match[str]) -> str:
    code, simple = match.groups()
    return chr(int(code, 16)) if code is not None else _SIMPLE_ESCAPES[simple]


def _replace_group(match: re.Match[str], group: str) -> str:
    """The match with only `group` replaced."""
    start, end = match.start(group) - match.start(), match.end(group) - match.start()
    text = match.group()
    return text[:start] + "[REDACTED]" + text[end:]
