"""What the terminal is given of a model's, a command's or a file's text (durable_agent/visible.py)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st


@settings(max_examples=300)
@given(st.text())
def test_visible_text_has_nothing_a_terminal_acts_on_and_keeps_the_rest(text: str) -> None:
    import unicodedata

    from durable_agent.visible import visible

    shown = visible(text)
    acts = [c for c in shown if unicodedata.category(c) == "Cc" and c not in "\t\n"]
    assert acts == [] and not set(shown) & {
        "\u202a",
        "\u202b",
        "\u202c",
        "\u202d",
        "\u202e",
        "\u2066",
        "\u2067",
        "\u2068",
        "\u2069",
    }
    if all(unicodedata.category(c) != "Cc" or c in "\t\n" for c in text) and not set(text) & set(
        "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    ):
        assert shown == text
    assert visible("a\x1b[2Kb\rc\x9bd\x7f") == "a\\x1b[2Kb\\x0dc\\x9bd\\x7f"
