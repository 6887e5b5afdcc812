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
