"""The dashboard's HTML, rendered on the server: one function per page and per table body.

Every value from an event, a rule or a record goes through `html.escape` (`_text`): an event's
data is the producer's, and the page must never run what a producer wrote. The only script is
the inline one below: on a server-sent event naming what the page shows, it fetches the
page's table body again (`?fragment=rows`), so a live table keeps its filters.

Called by `routes.py`; pure (the values come in, the text goes out).
"""

from __future__ import annotations

import html
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import quote

from handlers.dashboard.board import DeadLetterRow, DecisionRow, JobRow
from orchestrator.ledger import format_time
from orchestrator.rules.engine import KeyState
from orchestrator.rules.model import Rule, RuleSet

PREFIX = "/dashboard"
READ_ONLY_NOTICE = "Read-only: nothing on this dashboard can launch, cancel or change anything."
DAY = timedelta(days=1)

_STYLE = """
body{font-family:system-ui,sans-serif;margin:0;color:#1d2430;background:#f6f7f9}
header{background:#1d2430;color:#fff;padding:.6rem 1rem;display:flex;gap:1.2rem;align-items:center}
header a{color:#cfe0ff;text-decoration:none} header a.here{color:#fff;font-weight:600}
.notice{background:#fff4d6;border-bottom:1px solid #e7cf8a;padding:.4rem 1rem;font-size:.9rem}
main{padding:1rem} h1{font-size:1.3rem;margin:.2rem 0 .8rem} h2{font-size:1.05rem}
table{border-collapse:collapse;background:#fff;width:100%;font-size:.88rem;margin-bottom:1rem}
th,td{border:1px solid #dde1e7;padding:.3rem .5rem;text-align:left;vertical-align:top}
th{background:#eef1f5} code{font-size:.82rem} .empty{color:#777;font-style:italic}
.outcome{font-weight:600} .bar{background:#dde1e7;width:8rem;height:.7rem;display:inline-block}
.bar span{background:#3a7bd5;height:100%;display:block}
form.filters{display:flex;gap:.6rem;margin-bottom:.8rem} .live{color:#2a7a2a;font-size:.8rem}
"""

_LIVE_SCRIPT = """
<script>
(function () {
  var kinds = (document.body.dataset.live || "").split(" ").filter(Boolean);
  if (!kinds.length || !window.EventSource) { return; }
  var source = new EventSource("__PREFIX__/stream");
  function reload() {
    var query = new URLSearchParams(window.location.search);
    query.set("fragment", "rows");
    fetch(window.location.pathname + "?" + query.toString())
      .then(function (response) { return response.text(); })
      .then(function (text) { document.getElementById("rows").innerHTML = text; });
  }
  kinds.forEach(function (kind) { source.addEventListener(kind, reload); });
  source.onopen = function () { document.getElementById("live").textContent = "live"; };
})();
</script>
""".replace("__PREFIX__", PREFIX)

_PAGES = (
    ("rules", "Rules"),
    ("decisions", "Decisions"),
    ("jobs", "Jobs"),
    ("dead-letters", "Dead letters"),
)


@dataclass(frozen=True, slots=True)
class KeyView:
    """One rule's state for one key, as the rules page shows it."""

    key: str
    window_count: int
    window_sum: float
    joins: tuple[str, ...]
    cooldown_until: datetime | None
    launches_left_today: int | None
    """None: the rule has no daily budget."""
    running: str | None


def key_views(
    rule: Rule, states: Iterable[tuple[str, KeyState]], *, now: datetime
) -> list[KeyView]:
    """What *rule* holds for each key in *states* at *now* (keys it holds nothing for skipped)."""
    views = []
    for key, state in states:
        rule_state = state.rules.get(rule.name)
        if rule_state is None:
            continue
        cooldown_until = None
        if rule_state.last_launch is not None and rule.cooldown:
            ends = rule_state.last_launch + rule.cooldown
            cooldown_until = ends if ends > now else None
        left = None
        if rule.max_launches_per_day is not None:
            recent = [at for at in rule_state.launches if at > now - DAY]
            left = max(0, rule.max_launches_per_day - len(recent))
        views.append(
            KeyView(
                key=key,
                window_count=len(rule_state.entries),
                window_sum=sum(entry.amount for entry in rule_state.entries),
                joins=tuple(sorted(rule_state.joined)),
                cooldown_until=cooldown_until,
                launches_left_today=left,
                running=rule_state.running,
            )
        )
    return sorted(views, key=lambda view: view.key)


def page(title: str, here: str, body: str, *, live: Sequence[str] = ()) -> str:
    """A whole page: the navigation, the read-only notice on every page, *body*."""
    links = " ".join(
        f'<a href="{PREFIX}/{slug}"{" class=here" if slug == here else ""}>{name}</a>'
        for slug, name in _PAGES
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>{_text(title)} · tuneloop</title><style>{_STYLE}</style></head>"
        f'<body data-live="{_text(" ".join(live))}">'
        f"<header><strong>tuneloop</strong> {links} <span id=live class=live></span></header>"
        f"<div class=notice id=read-only>{READ_ONLY_NOTICE}</div>"
        f"<main><h1>{_text(title)}</h1>{body}</main>{_LIVE_SCRIPT}</body></html>"
    )


def rules_page(rules: RuleSet, states: Sequence[tuple[str, KeyState]], *, now: datetime) -> str:
    return page(
        "Rules",
        "rules",
        f"<p>Rule files version <code>{_text(rules.version)}</code>.</p>"
        f"<div id=rows>{rules_rows(rules, states, now=now)}</div>",
        live=("decisions", "jobs"),
    )


def rules_rows(rules: RuleSet, states: Sequence[tuple[str, KeyState]], *, now: datetime) -> str:
    if not rules.rules:
        return "<p class=empty>No rules loaded.</p>"
    parts = []
    for rule in rules.rules:
        views = key_views(rule, states, now=now)
        rows = "".join(
            "<tr>"
            f"<td>{_text(view.key)}</td><td>{view.window_count}</td><td>{view.window_sum:g}</td>"
            f"<td>{_text(', '.join(view.joins)) or '—'}</td>"
            f"<td>{_text(format_time(view.cooldown_until)) if view.cooldown_until else '—'}</td>"
            f"<td>{_budget_left(view.launches_left_today)}</td>"
            f"<td>{_job_link(view.running) if view.running else '—'}</td>"
            "</tr>"
            for view in views
        )
        table = (
            "<table><tr><th>key</th><th>window count</th><th>window sum</th><th>joins present</th>"
            "<th>cooldown until</th><th>launches left today</th><th>job in flight</th></tr>"
            f"{rows}</table>"
            if views
            else "<p class=empty>No key holds state for this rule on this worker.</p>"
        )
        parts.append(
            f'<section class=rule id="rule-{_text(rule.name)}">'
            f"<h2>{_text(rule.name)} <small>version <code>{_text(rule.version)}</code>"
            f" · on {_text(', '.join(rule.on.types))} · count {rule.count} in"
            f" {_text(str(rule.window))}</small></h2>{table}</section>"
        )
    return "".join(parts)


def decisions_page(
    rows: Sequence[DecisionRow], *, rule: str, key: str, outcome: str, outcomes: Sequence[str]
) -> str:
    choices = "".join(
        f'<option value="{_text(name)}"{" selected" if name == outcome else ""}>'
        f"{_text(name) or 'any'}</option>"
        for name in ("", *outcomes)
    )
    # A GET form: filtering only changes which rows this page shows.
    filters = (
        f'<form class=filters method=get action="{PREFIX}/decisions">'
        f'<label>rule <input name=rule value="{_text(rule)}"></label>'
        f'<label>key <input name=key value="{_text(key)}"></label>'
        f"<label>outcome <select name=outcome>{choices}</select></label>"
        "<button type=submit>Filter</button></form>"
    )
    return page(
        "Decisions",
        "decisions",
        f"<p>Newest first, as the engine recorded them on the audit topic.</p>{filters}"
        f"<div id=rows>{decisions_rows(rows)}</div>",
        live=("decisions",),
    )


def decisions_rows(rows: Sequence[DecisionRow]) -> str:
    if not rows:
        return "<p class=empty>No decision records yet.</p>"
    body = "".join(
        f'<tr id="{_text(row.decision_id)}" class=decision>'
        f"<td>{_text(row.time)}</td><td>{_text(row.rule)}</td><td>{_text(row.key)}</td>"
        f"<td class=outcome>{_text(row.outcome)}</td><td class=reason>{_text(row.reason)}</td>"
        f"<td class=message>{_text(row.message)}</td>"
        f"<td class=events>{'<br>'.join(f'<code>{_text(i)}</code>' for i in row.event_ids)}</td>"
        f"<td>{_decided_job(row)}</td>"
        "</tr>"
        for row in rows
    )
    return (
        "<table><tr><th>time</th><th>rule</th><th>key</th><th>outcome</th><th>reason</th>"
        f"<th>why</th><th>causing events</th><th>job</th></tr>{body}</table>"
    )


def jobs_page(rows: Sequence[JobRow]) -> str:
    return page(
        "Jobs",
        "jobs",
        f"<div id=rows>{jobs_rows(rows)}</div>"
        "<h2>Sweeps</h2><p class=empty>Sweeps and their trials appear here once sweeps exist.</p>",
        live=("jobs",),
    )


def jobs_rows(rows: Sequence[JobRow]) -> str:
    if not rows:
        return "<p class=empty>No jobs yet.</p>"
    body = "".join(
        f'<tr id="job-{_text(row.name)}" class=job>'
        f"<td><code>{_text(row.name)}</code></td><td>{_text(row.rule)}</td><td>{_text(row.key)}</td>"
        f"<td class=phase>{_text(row.phase)}</td><td class=progress>{_progress(row)}</td>"
        f"<td>{_eta(row.eta_seconds)}</td><td class=metrics>{_metrics(row)}</td>"
        f"<td>{_decision_link(row.decision_id)}</td><td>{_completion_link(row)}</td>"
        f"<td>{_text(row.updated)}</td></tr>"
        for row in rows
    )
    return (
        "<table><tr><th>job</th><th>rule</th><th>key</th><th>phase</th><th>progress</th>"
        "<th>ETA</th><th>metrics</th><th>decision</th><th>completion event</th><th>updated</th>"
        f"</tr>{body}</table>"
    )


def dead_letters_page(rows: Sequence[DeadLetterRow]) -> str:
    return page(
        "Dead letters",
        "dead-letters",
        "<p>Records the intake refused, with the original record as it arrived.</p>"
        f"<div id=rows>{dead_letters_rows(rows)}</div>",
        live=("dead-letters",),
    )


def dead_letters_rows(rows: Sequence[DeadLetterRow]) -> str:
    if not rows:
        return "<p class=empty>No dead letters.</p>"
    body = "".join(
        f'<tr class=dead-letter id="dl-{_text(row.position)}">'
        f"<td>{_text(row.at)}</td><td class=code><code>{_text(row.code)}</code></td>"
        f"<td>{_text(row.message)}</td><td>{_text(row.origin)}</td>"
        f'<td><a href="{PREFIX}/dead-letters/{quote(row.position)}/record.json" download>record'
        f'</a> · <a href="{PREFIX}/dead-letters/{quote(row.position)}/value" download>value</a>'
        "</td></tr>"
        for row in rows
    )
    return (
        "<table><tr><th>dead-lettered at</th><th>code</th><th>message</th>"
        f"<th>origin (topic/partition@offset)</th><th>original record</th></tr>{body}</table>"
    )


def _text(value: object) -> str:
    return html.escape(str(value), quote=True)


def _budget_left(left: int | None) -> str:
    return "no limit" if left is None else str(left)


def _decided_job(row: DecisionRow) -> str:
    """The job a record names; a link only where a job was launched (a shadow record names
    the job it would have launched, which does not exist)."""
    if not row.job_name:
        return ""
    if row.outcome == "launch":
        return _job_link(row.job_name)
    return f"<code>{_text(row.job_name)}</code>"


def _job_link(name: str) -> str:
    return f'<a href="{PREFIX}/jobs#job-{_text(name)}"><code>{_text(name)}</code></a>'


def _decision_link(decision_id: str) -> str:
    if not decision_id:
        return ""
    return (
        f'<a href="{PREFIX}/decisions#{_text(decision_id)}"><code>{_text(decision_id)}</code></a>'
    )


def _completion_link(row: JobRow) -> str:
    if not row.completion_event_id:
        return ""
    return (
        f'<a href="{PREFIX}/jobs/{quote(row.name)}/completion.json">'
        f"<code>{_text(row.completion_event_id)}</code></a>"
    )


def _progress(row: JobRow) -> str:
    percent = row.percent
    if percent is None:
        return ""
    step, total = row.progress.get("step"), row.progress.get("total_steps")
    steps = f" {_text(step)}/{_text(total)}" if step is not None and total is not None else ""
    width = max(0.0, min(100.0, percent))
    return f'<span class=bar><span style="width:{width:.0f}%"></span></span> {percent:.0f}%{steps}'


def _eta(seconds: float | None) -> str:
    if seconds is None:
        return ""
    whole = int(seconds)
    return f"{whole // 60}:{whole % 60:02d}"


def _metrics(row: JobRow) -> str:
    """The job's numbers (losses, steps, throughput); the rest of what the trainer reported
    (configuration, fingerprints) is in the completion event the row links to."""
    shown = {name: value for name, value in row.metrics.items() if _is_number(value)}
    # While it runs, the latest report's numbers: both backends put each metric by name
    # beside the bookkeeping keys (runtimes/kubernetes/progress.py says so).
    for name, value in row.progress.items():
        if name not in _PROGRESS_KEYS and name not in shown and _is_number(value):
            shown[name] = value
    return "<br>".join(f"{_text(name)} = {_text(_short(value))}" for name, value in shown.items())


_PROGRESS_KEYS = frozenset({"step", "total_steps", "percent", "eta_seconds", "final"})
"""Keys of a progress report that say how far, not how well (shown as the bar and ETA)."""


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _short(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return value if isinstance(value, str) else json.dumps(value)
