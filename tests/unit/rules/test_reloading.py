"""Hot reload: a valid change takes effect, an invalid one is logged and the old rules stay."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from handlers.rules_reloading import RulesReloader
from orchestrator.rules import loading
from orchestrator.rules.model import RuleSet

RULE = """\
rules:
  - name: r
    on: {type: io.tuneloop.drift.detected.v1}
    count: COUNT
    launch: {runtime: rt, base_model: m, dataset: d}
"""


def test_a_valid_change_is_handed_over_and_an_invalid_one_keeps_the_old_rules(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULE.replace("COUNT", "2"))
    first = loading.load_rules([path])
    seen: list[RuleSet] = []
    reloader = RulesReloader([path], on_change=seen.append, current=first)
    assert not reloader.poll()

    path.write_text(RULE.replace("COUNT", "3"))
    assert reloader.poll()
    assert seen[-1].rules[0].count == 3
    assert seen[-1].rules[0].version != first.rules[0].version

    path.write_text(RULE.replace("COUNT", "three"))
    with capture_logs() as logs:
        assert not reloader.poll()
    assert reloader.current is seen[-1]
    [entry] = [e for e in logs if e["event"] == "rules_reload_rejected"]
    assert "count must be a whole number" in entry["problems"][0]
    assert entry["problems"][0].startswith(f"{path}:4:12:")


def test_a_content_identical_rewrite_is_not_a_reload(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULE.replace("COUNT", "2"))
    seen: list[RuleSet] = []
    reloader = RulesReloader([path], on_change=seen.append, current=loading.load_rules([path]))
    path.write_text(RULE.replace("COUNT", "2") + "# touched\n")
    assert not reloader.poll()
    assert seen == []


async def test_watch_notices_a_change_in_the_background(tmp_path):
    path = tmp_path / "rules.yaml"
    path.write_text(RULE.replace("COUNT", "2"))
    seen: list[RuleSet] = []
    reloader = RulesReloader([path], on_change=seen.append, current=loading.load_rules([path]))
    task = asyncio.create_task(reloader.watch(interval=0.01))
    path.write_text(RULE.replace("COUNT", "5"))
    for _ in range(200):
        if seen:
            break
        await asyncio.sleep(0.01)
    task.cancel()
    assert seen[-1].rules[0].count == 5
