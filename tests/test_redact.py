"""Secrets never reach the database or the model: env values and well-known key shapes."""

from __future__ import annotations

import re
import time
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from durable_agent import redact as redact_module
from durable_agent.redact import Redactor, is_secret_name

OPENAI = "sk-proj-Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z"
ENV = {
    "OPENAI_API_KEY": OPENAI,
    "GITHUB_TOKEN": "gh-internal-7f3a9c2e",
    "DB_PASSWORD": "correct-horse-battery",
    "aws_secret_access_key": "wJalrXUtnFEMI/K7MDENG/bPxRfiCY",
    "SHORT_KEY": "abc12",  # too short to redact without destroying ordinary text
    "FEATURE_TOKEN": "true",  # boring
    "HOME": "/home/ada",
    "EDITOR": "vim-tiny-editor",
}


@pytest.fixture
def redactor() -> Redactor:
    return Redactor.from_env(ENV)


def test_env_secrets_are_named_in_the_replacement(redactor: Redactor) -> None:
    text = (
        f"key={OPENAI}\ntoken: gh-internal-7f3a9c2e, pw correct-horse-battery "
        "aws wJalrXUtnFEMI/K7MDENG/bPxRfiCY."
    )
    assert redactor.redact(text) == (
        "key=[REDACTED:OPENAI_API_KEY]\ntoken: [REDACTED:GITHUB_TOKEN], "
        "pw [REDACTED:DB_PASSWORD] aws [REDACTED:aws_secret_access_key]."
    )


def test_secret_inside_a_longer_string_is_still_redacted(redactor: Redactor) -> None:
    assert redactor.redact("x=correct-horse-battery-staple") == "x=[REDACTED:DB_PASSWORD]-staple"


def test_non_secrets_are_untouched(redactor: Redactor) -> None:
    text = (
        "HOME is /home/ada, editor vim-tiny-editor, true, abc12, 1\n"
        "task-runner-configuration-for-the-build sk-learn-model-selection-guide\n"
        "def get_api_key(): return os.environ['OPENAI_API_KEY']\n"
        "https://example.com/path?q=1 and git@github.com:org/repo.git\n"
        "Bearer\n"
    )
    assert redactor.redact(text) == text


@pytest.mark.parametrize(
    "secret",
    [
        "sk-" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v2W3x4",  # OpenAI legacy
        OPENAI.replace("Ab3", "Zz9"),  # OpenAI project key (not from the environment)
        "sk-ant-api03-" + "Xy9_" * 20 + "AA",  # Anthropic
        "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",  # GitHub classic
        "gho_" + "Q" * 36,
        "github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz",  # GitHub fine-grained
        "AKIAIOSFODNN7EXAMPLE",  # AWS
        "xoxb-123456789012-1234567890123-AbCdEfGhIjKlMnOpQrStUvWx",  # Slack
        "AIzaSyA1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q",  # Google
        "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0",
    ],
)
def test_key_shapes_are_redacted(secret: str) -> None:
    redacted = Redactor().redact(f"config: {secret} (copied)")
    assert redacted == "config: [REDACTED] (copied)"


def test_shape_must_start_a_word() -> None:
    text = "xAKIAIOSFODNN7EXAMPLE and disk-" + "a1" * 15
    assert Redactor().redact(text) == text


def test_bearer_and_url_passwords_keep_the_readable_part() -> None:
    r = Redactor()
    assert r.redact("Authorization: Bearer abc123.def456-ghi") == "Authorization: Bearer [REDACTED]"
    assert (
        r.redact("DATABASE_URL=postgresql://app:s3cr3t!@db:5432/prod")
        == "DATABASE_URL=postgresql://app:[REDACTED]@db:5432/prod"
    )


def test_private_keys_are_redacted_whole_even_when_truncated() -> None:
    pem = (
        "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\nQUFBQUFB\n"
        "-----END OPENSSH PRIVATE KEY-----"
    )
    r = Redactor()
    assert r.redact(f"before\n{pem}\nafter") == "before\n[REDACTED]\nafter"
    assert r.redact("cat id_rsa:\n" + pem[:60]) == "cat id_rsa:\n[REDACTED]"
    public = "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkq\n-----END PUBLIC KEY-----"
    assert r.redact(public) == public


def test_longest_secret_wins_when_one_contains_another() -> None:
    r = Redactor({"A_KEY": "abcdef123", "B_KEY": "abcdef123456"})
    assert r.redact("abcdef123456 abcdef123") == "[REDACTED:B_KEY] [REDACTED:A_KEY]"


def test_regex_metacharacters_in_secrets_are_literal() -> None:
    r = Redactor({"X_SECRET": "a.b*c+d(e)"})
    assert r.redact("a.b*c+d(e) axbbbcdde") == "[REDACTED:X_SECRET] axbbbcdde"


def test_redact_json_walks_nested_values_and_keys(redactor: Redactor) -> None:
    obj: dict[str, Any] = {
        "args": {"command": f"curl -H 'Authorization: Bearer {OPENAI}'", "n": 3},
        "list": ["ok", ("correct-horse-battery", None, 1.5, True)],
        "correct-horse-battery": "key as well",
    }
    assert redactor.redact_json(obj) == {
        "args": {"command": "curl -H 'Authorization: Bearer [REDACTED]'", "n": 3},
        "list": ["ok", ("[REDACTED:DB_PASSWORD]", None, 1.5, True)],
        "[REDACTED:DB_PASSWORD]": "key as well",
    }
    assert obj["list"][1][0] == "correct-horse-battery"  # a copy: the input is unchanged


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("OPENAI_API_KEY", True),
        ("api_key", True),
        ("GH_TOKEN", True),
        ("AWS_SESSION_TOKEN", True),
        ("CLIENT_SECRET", True),
        ("PGPASSWORD", True),
        ("SMTP_PASSWD", True),
        ("NPM_AUTH", True),
        ("GOOGLE_APPLICATION_CREDENTIALS", True),
        ("SENTRY_DSN", True),
        ("GH_PAT", True),
        ("MYSQL_PWD", True),
        ("MYSQL_PASS", True),
        ("HTTP_AUTHORIZATION", True),
        ("OAUTH_CLIENT", True),
        ("OLDPWD", False),
        ("PATH", False),
        ("HOME", False),
        ("GIT_AUTHOR_NAME", False),
        ("PWD", False),
        ("PYTHONPATH", False),
        ("TERM", False),
        ("LANG", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_a_large_output_is_redacted_quickly() -> None:
    # It runs on every stored message; this text is 30x the default output cap.
    env = {f"SERVICE_{i}_TOKEN": f"tok-{i:03d}-9f8e7d6c5b4a" for i in range(30)}
    r = Redactor.from_env(env)
    text = "lorem ipsum dolor sit amet, consectetur adipiscing elit 12345 foo_bar baz\n" * 12_000
    started = time.perf_counter()
    assert r.redact(text + "tok-007-9f8e7d6c5b4a") == text + "[REDACTED:SERVICE_7_TOKEN]"
    assert time.perf_counter() - started < 1.0


def test_redact_known_replaces_only_the_harness_secrets() -> None:
    r = Redactor({"DB_PASSWORD": "correct-horse-battery"})
    text = "pw=correct-horse-battery key=AKIAIOSFODNN7EXAMPLE"
    assert r.redact_known(text) == "pw=[REDACTED:DB_PASSWORD] key=AKIAIOSFODNN7EXAMPLE"
    assert r.redact(text) == "pw=[REDACTED:DB_PASSWORD] key=[REDACTED]"
    assert (
        Redactor({"X_TOKEN": "abcdefgh"}, shapes=False).redact(text + " abcdefgh")
        == text + " [REDACTED:X_TOKEN]"
    )
    assert Redactor().redact_known(text) == text


# The prefilter: text with none of the shapes' prefixes (and none of the known values) is
# returned without running the alternation. Both halves of that promise, generated.

_SHAPES = redact_module._BOUNDED_SHAPES + redact_module._FREE_SHAPES


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_every_key_shape_contains_one_of_the_prefilters_prefixes(data: st.DataObject) -> None:
    pattern = data.draw(st.sampled_from(_SHAPES))
    found = data.draw(st.from_regex(pattern, fullmatch=True))
    assert any(p in found for p in redact_module._SHAPE_PREFIXES), (pattern, found)


_pieces = st.sampled_from(
    [
        "sk-",
        "proj-",
        "Ab3dEf6hIj9kLm2nOp5qRs8tUv1wXy4z",
        "ghp_",
        "github_pat_",
        "AKIA",
        "IOSFODNN7EXAMPLE",
        "xoxb-",
        "AIza",
        "eyJ",
        ".",
        "Bearer ",
        "://me:",
        "@db",
        "-----BEGIN RSA PRIVATE KEY-----",
        "\n",
        " ",
        "e",
        "s",
        "g",
        "-",
        "_",
        "correct-horse-battery",
        "x" * 40,
        "12345",
        "é",
    ]
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_pieces, max_size=30).map("".join))
def test_the_prefilter_never_changes_what_is_redacted(text: str) -> None:
    r = Redactor.from_env({"DB_PASSWORD": "correct-horse-battery"})
    unfiltered = r._pattern.sub(r._replace, text)  # type: ignore[union-attr]
    assert r.redact(text) == unfiltered


@settings(max_examples=300, deadline=None)
@given(st.lists(_pieces, max_size=30).map("".join), st.booleans())
def test_finds_is_true_exactly_where_redact_changes_the_text(text: str, shapes: bool) -> None:
    # What withholds a workspace file from snapshots (workspace/secrets.py): the same
    # decisions as the redaction of observations, a word-inner `sk-...` included.
    r = Redactor.from_env({"DB_PASSWORD": "correct-horse-battery"}, shapes=shapes)
    assert r.finds(text) == (r.redact(text) != text)


def test_the_fingerprint_tells_what_a_redactor_finds() -> None:
    a = Redactor.from_env({"DB_PASSWORD": "correct-horse-battery", "HOME": "/root"})
    assert a.fingerprint == Redactor.from_env({"X_TOKEN": "correct-horse-battery"}).fingerprint
    assert a.fingerprint != Redactor.from_env({"X_TOKEN": "another-value"}).fingerprint
    assert (
        a.fingerprint
        != Redactor.from_env({"X_TOKEN": "correct-horse-battery"}, shapes=False).fingerprint
    )


def test_arguments_keep_every_byte_but_the_string_that_held_the_secret() -> None:
    # Re-encoding the whole value once turned 1e400 into Infinity (not JSON), 1.0 into 1.0
    # but 1E2 into 100.0, and dropped a key given twice.
    r = Redactor({"X_TOKEN": "tok-abcdef123456"})
    escaped = '"\\u0074ok-abcdef123456 \\u00e9"'
    text = '{"n": 1e400, "m": 1E2, "k": "a\\u0041", "k": ' + escaped + ',\n "z": [1.50, -0.0]}'
    out = r.redact_known_arguments(text)
    assert (
        out
        == '{"n": 1e400, "m": 1E2, "k": "a\\u0041", "k": "[REDACTED:X_TOKEN] é",\n "z": [1.50, -0.0]}'
    )
    assert r.redact_known_arguments(text.replace(escaped, '"plain"')) == text.replace(
        escaped, '"plain"'
    )


@settings(max_examples=300, deadline=None)
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
        max_leaves=8,
    ),
    ascii_only=st.booleans(),
    spot=st.integers(min_value=0),
)
def test_a_secret_escaped_anywhere_in_json_arguments_never_survives_and_nothing_else_changes(
    value: Any, ascii_only: bool, spot: int
) -> None:
    import json

    secret = "tok-abcdef123456"
    r = Redactor({"X_TOKEN": secret})
    plain = json.dumps(value, ensure_ascii=ascii_only)
    assert r.redact_known_arguments(plain) == plain  # no secret: byte for byte
    strings = [m.start() for m in re.finditer(r'(?<!\\)"', plain)]
    if not strings:
        return
    at = strings[spot % len(strings)] + 1  # just inside a string (or a key), or just after one
    hidden = "".join(f"\\u{ord(c):04x}" for c in secret)
    text = plain[:at] + hidden + plain[at:]
    try:
        json.loads(text)
    except ValueError:
        return  # after a string's closing quote: not JSON any more (the other path)
    out = r.redact_known_arguments(text)
    assert secret not in json.dumps(json.loads(out), ensure_ascii=False)
    assert re.sub(r'"(?:[^"\\]|\\.)*"', '""', out) == re.sub(r'"(?:[^"\\]|\\.)*"', '""', text)


def _decoded_every_way(text: str, rounds: int = 4) -> list[str]:
    """`text` and what unescaping it as a JSON string's content, again and again, gives."""
    out = [text]
    for _ in range(rounds):
        out.append(redact_module._ANY_ESCAPE.sub(redact_module._unescape, out[-1]))
    return out


def test_arguments_that_are_not_json_never_hand_a_tool_json_that_decodes_to_the_secret() -> None:
    # Decoded once, `\u0022` closed the string (the text became JSON) and `\u005cu0074`
    # became `\u0074`, which the tool's own parse decoded to the secret.
    secret = "tok-abcdef1234567890/xyz"
    r = Redactor({"API_KEY": secret})
    for text in (
        r'{"command": "echo \u0074ok-abcdef1234567890\/xyz; echo \u005cu0074ok-abcdef1234567890\/xyz\u0022}',
        r'{"c": "\u0074ok-abcdef1234567890\/xyz\u0022, "d": "\u005c\u0075\u0030\u0030\u0037\u0034ok"}',
        '{"c": "tok-abcdef1234567890\\/xyz',
    ):
        out = r.redact_known_arguments(text)
        assert all(secret not in d for d in _decoded_every_way(out)), out


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(
        st.sampled_from(
            [
                '{"c": "',
                '"',
                "}",
                "\\u0022",
                "\\u005c",
                "\\\\",
                "\\/",
                " ",
                "x",
                "SECRET",
                "ESCAPED",
                "DOUBLE",
                "SLASHED",
            ]
        ),
        max_size=12,
    )
)
# two escaped backslashes, then the secret escaped twice: decoded once more than needed, its
# first letter went into a `\t` and the rest was sent on
@example(['"', "\\u005c", "\\u005c", "DOUBLE", '"'])
def test_no_spelling_of_the_secret_in_broken_json_survives(parts: list[str]) -> None:
    import json

    secret = "tok-abc/def123456"
    spellings = {
        "SECRET": secret,
        "ESCAPED": "".join(f"\\u{ord(c):04x}" for c in secret),
        "DOUBLE": "".join(f"\\u005cu{ord(c):04x}" for c in secret),
        "SLASHED": secret.replace("/", "\\/"),
    }
    text = "".join(spellings.get(p, p) for p in parts)
    out = Redactor({"API_KEY": secret}).redact_known_arguments(text)
    try:
        parsed = json.loads(out)
    except ValueError:
        parsed = None
    assert secret not in json.dumps(parsed, ensure_ascii=False)  # what a tool would receive
    if parsed is None:
        # Not JSON: the call fails. Neither it nor one decoding of it holds the secret; only
        # a spelling that nothing decodes (a double escape, left as the model sent it) may.
        assert secret not in "".join(_decoded_every_way(out, rounds=1))


def test_free_text_keeps_every_byte_unless_an_escaped_secret_is_in_it() -> None:
    secret = "tok-abcdef1234567890"
    r = Redactor({"API_KEY": secret})
    prose = 'He said "C:\\path\\n" and \\d+ then "caf\\u00e9"; TOOL_CALL {"name": "x", "input": {"a": "\\u0041"}}'
    assert r.redact_known_escaped(prose) == prose  # no secret: byte for byte, odd escapes and all
    hidden = "".join(f"\\u{ord(c):04x}" for c in secret)
    inside = 'TOOL_CALL {"name": "w", "input": {"c": "' + hidden + '", "n": 1e400}}'
    assert (
        r.redact_known_escaped(inside)
        == 'TOOL_CALL {"name": "w", "input": {"c": "[REDACTED:API_KEY]", "n": 1e400}}'
    )
    for broken in ('He said "' + hidden, "x \\u0022" + hidden + '\\u0022 "C:\\q"'):
        out = r.redact_known_escaped(broken)
        assert all(secret not in d for d in _decoded_every_way(out)), out


def _spelt(secret: str, level: int) -> str:
    """`secret` with its first character JSON-escaped `level` times over (1: `\\u0073k-...`)."""
    return "\\" * 2 ** (level - 1) + f"u{ord(secret[0]):04x}" + secret[1:]


def _assert_no_spelling(secret: str, out: str, rounds: int = 4) -> None:
    assert all(secret not in d for d in _decoded_every_way(out, rounds)), out


def test_a_secret_escaped_twice_or_inside_a_json_string_of_json_is_found_too() -> None:
    # The text protocol decodes `input` given as a string holding JSON twice; a step's `raw`
    # keeps the answer as JSON text (its content's escapes escaped again); and decoding the
    # whole text once turned a double escape into a single one.
    import json

    secret = "sk-proj-ABCDEF1234567890abcdef"
    r = Redactor({"MY_API_KEY": secret})
    once, twice = _spelt(secret, 1), _spelt(secret, 2)
    texts = [
        'TOOL_CALL {"name": "write_file", "input": "{\\"path\\": \\"a\\", \\"content\\": \\"'
        + twice
        + '\\"}"}',
        f"See {once} and {twice}",
        json.dumps({"role": "assistant", "content": f"note {once}"}),
    ]
    for text in texts:
        _assert_no_spelling(secret, r.redact_known_escaped(text))
    _assert_no_spelling(
        secret, r.redact_known_arguments('{"path": "a", "content": "' + twice + '"}')
    )


def test_a_spelling_deeper_than_we_look_never_comes_out_nearer() -> None:
    # Decoded four times and redacted, a five-level spelling came out as a one-level one.
    secret = "s3cr3t-Value-42"
    r = Redactor({"DEPLOY_TOKEN": secret})
    lvl1, lvl5 = _spelt(secret, 1), _spelt(secret, 5)
    for text in (f"note {lvl1} and {lvl5}", '{"command": "echo ' + lvl1 + " " + lvl5 + '"}'):
        for out in (r.redact_known_escaped(text), r.redact_known_arguments(text)):
            _assert_no_spelling(secret, out, rounds=8)


def test_unterminated_quotes_do_not_make_the_scan_quadratic() -> None:
    # Every later quote restarted a scan to the end of the text: 64 KB took 11 s.
    import time

    secret = "s3cr3t-Value-42"
    r = Redactor({"DEPLOY_TOKEN": secret})
    body = _spelt(secret, 1) + ' "' + '\\"' * 64_000
    started = time.monotonic()
    out = r.redact_known_escaped(body)
    assert time.monotonic() - started < 10  # linear: well under a second; quadratic: ~45 s
    _assert_no_spelling(secret, out)
