"""An offline (scripted) run never imports `openai`: ~0.4 s saved on every such start.

openai's exceptions are mapped where they arise, in `models/openai_chat.py`; the retry
layer (`models/retry.py`, `models/failures.py`) never imports openai.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable
from typing import Any

IMPORTED = re.compile(r"^import time:\s+\d+ \|\s+\d+ \|\s*(\S+)$", re.MULTILINE)


def test_a_scripted_run_does_not_import_openai(
        cli: Callable[..., Any], write_script: Callable[[list[dict[str, Any]]], str]) -> None:
    model = write_script([{"tool_calls": [{"name": "list_files", "arguments": {}}]},
                          {"content": "done"}])
    result = cli("start", "look around", "--model", model, "--json",
                 extra_env={"PYTHONPROFILEIMPORTTIME": "1"})
    assert result.code == 0, result.stderr
    modules = set(IMPORTED.findall(result.stderr))
    assert "durable_agent.runner" in modules  # guard the check: the profile was captured
    assert "tenacity" in modules  # the retry layer did run
    assert not {m for m in modules if m == "openai" or m.startswith("openai.")}


def test_the_retry_layer_never_imports_openai_and_the_boundary_maps_its_errors() -> None:
    code = (
        "import sys\n"
        "from durable_agent.models.retry import call_with_retries, classify\n"
        "print(classify(TimeoutError('slow')).reason, 'openai' in sys.modules)\n"
        "import openai\n"
        "from durable_agent.models.openai_chat import map_exception\n"
        "print(map_exception(openai.APITimeoutError(request=None)).reason)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split("\n")[:2] == ["timeout False", "timeout"]
