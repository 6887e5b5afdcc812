"""Azure OpenAI through the openai package's `AzureOpenAI` client (issue 17), against the
fake server: the deployment path, the `api-version` query and the `api-key` header."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from provider_support import KEY, Endpoint, serve

from durable_agent.models.openai_chat import azure_target

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "notes.txt"}}]},
    {"content": "All done."},
]


@pytest.fixture
def api(
    cli: Callable[..., Any], env: dict[str, str], workspace: Path, tmp_path: Path
) -> Iterator[Endpoint]:
    with serve(cli, env, workspace, tmp_path, SCRIPT) as endpoint:
        yield endpoint


def root(api: Endpoint) -> str:
    return api.server.url.removesuffix("/v1")


def run(api: Endpoint, *flags: str) -> Any:
    return api.cli(
        "start", "fix the bug", "--model", "gpt-4o", *flags, "--json", extra_env=api.cli_env()
    )


def assert_azure_requests(api: Endpoint, deployment: str, version: str) -> None:
    assert len(api.server.requests) == 2
    for request in api.server.requests:
        assert request["path"] == f"/openai/deployments/{deployment}/chat/completions"
        assert request["query"] == f"api-version={version}"
        assert request["headers"]["api-key"] == KEY
        assert "authorization" not in request["headers"]  # no Bearer header


def test_a_deployment_url_is_detected_as_azure(api: Endpoint) -> None:
    result = run(api, "--base-url", f"{root(api)}/openai/deployments/my-dep?api-version=2024-10-21")
    assert result.code == 0, result.stderr
    assert result.json()["answer"] == "All done."
    assert_azure_requests(api, "my-dep", "2024-10-21")


def test_api_type_azure_with_the_resource_endpoint_and_an_api_version_setting(
    api: Endpoint,
) -> None:
    api.configure(api_version="2025-01-01-preview")
    result = run(api, "--base-url", root(api), "--api-type", "azure")
    assert result.code == 0, result.stderr
    assert_azure_requests(api, "gpt-4o", "2025-01-01-preview")  # the model names the deployment


def test_azure_without_an_api_version_is_a_configuration_error(api: Endpoint) -> None:
    result = run(api, "--base-url", root(api), "--api-type", "azure")
    assert result.code == 2
    assert "API version" in result.stderr and len(result.stderr.strip().splitlines()) == 1
    assert api.server.requests == []


def test_an_ordinary_url_stays_openai() -> None:
    assert azure_target("http://localhost:11434/v1") is None
    assert azure_target(
        "https://x.openai.azure.com/openai/deployments/d/chat/completions?api-version=v"
    ) == ("https://x.openai.azure.com", "d", "v")
