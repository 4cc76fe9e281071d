"""Every code block in docs/ is checked: YAML parses (and a rule file is a valid rule file),
JSON parses, shell has valid syntax, Python compiles. The getting-started page's shell blocks
are also executed, by tests/e2e/test_getting_started.py; rule examples in docs/rules.md are
run by the rule tests."""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from orchestrator.rules.parsing import Source, parse_files

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```([\w+-]*)[^\n]*\n(.*?)^```", re.DOTALL | re.MULTILINE)


def blocks() -> list[tuple[str, str, str]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        for number, match in enumerate(FENCE.finditer(page.read_text(encoding="utf-8")), 1):
            found.append(
                (f"{page.relative_to(DOCS)}#{number}", match.group(1).lower(), match.group(2))
            )
    return found


BLOCKS = blocks()


def of(*languages: str) -> list[object]:
    return [pytest.param(body, id=name) for name, language, body in BLOCKS if language in languages]


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
