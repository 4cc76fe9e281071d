"""Every code block in docs/ is checked: YAML parses (and a rule file is a valid rule file),
JSON parses, shell has valid syntax, Python compiles and runs. The getting-started page's
shell blocks are also executed, by tests/e2e/test_getting_started.py; rule examples in
docs/rules.md are run by the rule tests.

A Python block runs in a fresh namespace, in a temporary working directory; one that may
`await` runs in an event loop. A block that needs a service says so in an HTML comment on the
line before its fence, which a reader of the rendered page does not see:

    <!-- needs: kafka -->

Such a block is compiled here and run by tests/integration/test_docs_snippets.py, on the real
service.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.rules.parsing import Source, parse_files

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)
NEEDS = re.compile(r"<!--\s*needs:\s*([\w ,-]+?)\s*-->\s*$")
"""The marker of a block that needs a service, on the line before its fence."""


def fenced(text: str) -> list[tuple[str, str, str]]:
    """(language, body, the services it needs) of every fenced block of a page's *text*."""
    found = []
    for match in FENCE.finditer(text):
        line_before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        marker = NEEDS.search(line_before)
        found.append((match.group(1).lower(), match.group(2), marker.group(1) if marker else ""))
    return found


def blocks() -> list[tuple[str, str, str, str]]:
    """(id, language, body, the services it needs) of every fenced block in docs/."""
    return [
        (f"{page.relative_to(DOCS)}#{number}", language, body, needs)
        for page in sorted(DOCS.rglob("*.md"))
        for number, (language, body, needs) in enumerate(
            fenced(page.read_text(encoding="utf-8")), 1
        )
    ]


BLOCKS = blocks()


def of(*languages: str) -> list[object]:
    return [
        pytest.param(body, id=name) for name, language, body, _ in BLOCKS if language in languages
    ]


def runnable(*languages: str) -> list[object]:
    return [
        pytest.param(
            body,
            id=name,
            marks=[pytest.mark.skip(reason=f"needs {needs}: run by tests/integration")]
            if needs
            else [],
        )
        for name, language, body, needs in BLOCKS
        if language in languages
    ]


def test_the_docs_have_code_blocks_to_check():
    assert len(BLOCKS) > 20


@pytest.mark.parametrize("body", of("yaml", "yml"))
def test_yaml_blocks_parse_and_rule_files_are_valid(body):
    documents = [d for d in yaml.safe_load_all(body) if d is not None]
    for document in documents:
        if isinstance(document, dict) and isinstance(document.get("rules"), list):
            parse_files([Source("docs.yaml", body)])


@pytest.mark.parametrize("body", of("json", "jsonl"))
def test_json_blocks_parse(body):
    try:
        json.loads(body)
    except json.JSONDecodeError:
        for line in body.splitlines():  # JSON Lines
            if line.strip():
                json.loads(line)


@pytest.mark.parametrize("body", of("bash", "sh", "shell", "console"))
def test_shell_blocks_have_valid_syntax(body):
    result = subprocess.run(["bash", "-n"], input=body, text=True, capture_output=True, check=False)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("body", of("python", "py"))
def test_python_blocks_compile(body):
    # snippets may await, as they would inside the async code they belong to
    compile(body, "docs", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.parametrize("body", runnable("python", "py"))
def test_python_blocks_run(body, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = compile(body, "docs", "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    namespace: dict[str, object] = {"__name__": "docs_snippet"}
    if code.co_flags & inspect.CO_COROUTINE:
        asyncio.run(eval(code, namespace))
    else:
        exec(code, namespace)


def test_a_needs_marker_on_the_line_before_the_fence_names_the_service():
    page = (
        "Text.\n\n<!-- needs: kafka -->\n```python\nawait publisher.publish(event)\n```\n\n"
        "<!-- needs: kafka -->\n\nA paragraph between.\n\n```python\nx = 1\n```\n"
    )
    assert [(language, needs) for language, _, needs in fenced(page)] == [
        ("python", "kafka"),
        ("python", ""),
    ]
