"""Every rule-file example in docs/rules.md parses, and the example files work together."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from orchestrator.rules import loading
from orchestrator.rules.parsing import Source, parse_files

DOC = Path("docs/rules.md")
BLOCKS = re.findall(r"```yaml\n(.*?)```", DOC.read_text(encoding="utf-8"), flags=re.DOTALL)
RULE_FILES = [block for block in BLOCKS if not block.startswith("cases:")]


def test_the_reference_has_examples():
    assert len(RULE_FILES) >= 4


@pytest.mark.parametrize("text", RULE_FILES, ids=lambda text: text.split("name: ")[1].split()[0])
def test_every_rule_file_example_in_the_reference_is_valid(text):
    rules = parse_files([Source("docs/rules.md", text)])
    assert rules.rules


def test_the_rule_test_example_in_the_reference_is_valid_yaml():
    [block] = [b for b in BLOCKS if b.startswith("cases:")]
    case = yaml.safe_load(block)["cases"][0]
    assert {"name", "events", "expect"} <= set(case)


def test_the_example_rules_validate():
    assert len(loading.load_rules(["docs/examples/rules.yaml"]).rules) == 2
