"""The docs say what the code does (issue 17): every stop reason is in docs/schema.md, the
scripted-model format in docs/models.md is a script the loader accepts and the README links
to it, and Azure is documented next to the local servers."""

from __future__ import annotations

import json
import re
from pathlib import Path

from durable_agent.models.scripted import validate_script
from durable_agent.status import STATUS_FOR_REASON, StopReason

ROOT = Path(__file__).resolve().parent.parent
MODELS = (ROOT / "docs" / "models.md").read_text()
README = (ROOT / "README.md").read_text()


def test_every_stop_reason_is_documented_with_a_status() -> None:
    schema = (ROOT / "docs" / "schema.md").read_text()
    for reason in StopReason:
        assert f"`{reason.value}`" in schema, reason
        assert reason in STATUS_FOR_REASON
    assert "`empty_answer`" in README


def test_the_scripted_model_example_is_a_valid_script_and_readme_links_it() -> None:
    section = MODELS[MODELS.index("### Scripted models"):]
    section = section[:section.index("\n### ", 5)]
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
    said = text[start:start + 1200]
    assert "What it does guarantee:" in said and "What it does not guarantee:" in said
    assert "sandbox" in said and "it is a lexer, not a shell" in said


def test_the_readme_and_models_doc_name_model_calls_and_answers_that_are_not_final() -> None:
    text, models = " ".join(README.split()), " ".join(MODELS.split())
    assert "`6 model calls · 11 steps · 5 tool calls · ...`" in text
    assert "resuming from model call 6" in text and "`MODEL CALLS`" in text
    for words in ("cut off at the length limit, told to continue", "empty answer, told to answer", "~989+8"):
        assert words in text and words in models, words
