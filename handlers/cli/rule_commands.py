"""`tuneloop check | simulate | explain | test`: the rule-file commands.

Thin: they read files, call `orchestrator.rules` (loading, simulation) and print. `simulate`
drives the same engine functions as the service, so what it shows is what the service does.

Exit codes: 0 success; 1 invalid rules, failing rule tests or unreadable input; 2 wrong
command-line usage (typer's own).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Iterator, Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

import typer
import yaml

from handlers.codec import KafkaRecord, decode_record
from handlers.dead_letters import DeadLetterReason, original_headers, read_reason
from orchestrator import event_json
from orchestrator.errors import ConfigError, InvalidEventError
from orchestrator.events import CloudEvent
from orchestrator.ledger import (
    DecisionRecord,
    Outcome,
    Reason,
    format_time,
    from_cloudevent,
    job_to_json,
)
from orchestrator.rules import loading
from orchestrator.rules.durations import DurationError, parse_duration
from orchestrator.rules.model import RuleSet
from orchestrator.rules.parsing import RuleFileError
from orchestrator.rules.simulation import Simulation, simulate
from orchestrator.sweeps.scripting import TrialScript, parse_script
from orchestrator.sweeps.suggesting import Suggesters
from orchestrator.vocabulary.registry import SchemaRegistry

AUDIT_READ_IDLE_MS = 3000
"""`explain --bootstrap` stops reading once the audit topic was quiet this long."""
AUDIT_MAX_EVENT_BYTES = 1 << 20


@functools.cache
def vocabulary() -> SchemaRegistry:
    """tuneloop's event vocabulary, loaded once."""
    return SchemaRegistry.builtin()


def register(app: typer.Typer) -> None:
    """Add this module's commands to *app*."""
    app.command("check")(check)
    app.command("simulate")(simulate_command)
    app.command("explain")(explain)
    app.command("test")(run_rule_tests)


def _fail(message: str) -> typer.Exit:
    typer.echo(message, err=True)
    return typer.Exit(1)


def _load(paths: Sequence[Path]) -> RuleSet:
    try:
        return loading.load_rules(paths)
    except RuleFileError as exc:
        for problem in exc.problems:
            typer.echo(str(problem))
        raise typer.Exit(1) from exc
    except ConfigError as exc:  # pragma: no cover - load_rules raises RuleFileError only
        raise _fail(str(exc)) from exc


def check(
    paths: Annotated[list[Path], typer.Argument(help="Rule files or directories of them.")],
) -> None:
    """Validate rule files: a one-line summary, or one `FILE:LINE:COL: message` per problem."""
    rules = _load(paths)
    typer.echo(
        f"ok: {len(rules.rules)} rule(s) in {len(rules.files)} file(s), version {rules.version}"
        f" ({', '.join(f'{r.name}@{r.version}' for r in rules.rules)})"
    )


def _parse_event(data: Any) -> CloudEvent:
    """A structured-mode event, checked as the service's intake checks it: CloudEvents
    attributes, then `data` against the vocabulary's schema for its type.

    Raises:
        ValueError: saying what is wrong.
    """
    try:
        event = event_json.from_json(data)
        vocabulary().validate(event, accept_unknown=True)
    except InvalidEventError as exc:
        raise ValueError(exc.message) from exc
    return event


def _read_events(path: Path) -> Iterator[CloudEvent]:
    """The valid events of a JSON Lines file; invalid lines go to stderr and are skipped."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"{path}: cannot read: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield _parse_event(json.loads(line))
        except ValueError as exc:  # json.JSONDecodeError is a ValueError
            typer.echo(f"{path}:{number}: skipped invalid event: {exc}", err=True)


def _duration_option(text: str) -> timedelta:
    try:
        return parse_duration(text)
    except DurationError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _trial_script(path: Path | None) -> TrialScript | None:
    """The trial outcomes scripted in *path* (YAML or JSON; orchestrator/sweeps/scripting.py)."""
    if path is None:
        return None
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
        return parse_script(data, parse_duration=parse_duration)
    except (OSError, UnicodeDecodeError, yaml.YAMLError, ValueError) as exc:
        raise _fail(f"{path}: not a trial script: {exc}") from exc


def _suggesters() -> Suggesters:
    # The worker's own suggesters (TPE through optuna); imported only to simulate.
    from handlers.app import sweep_suggesters

    return sweep_suggesters()


def _run(
    rules: RuleSet, events: Path, assume_duration: str, assume_metrics: Path | None = None
) -> tuple[DecisionRecord, ...]:
    run = Simulation(
        rules,
        assume_duration=_duration_option(assume_duration),
        assume_metrics=_trial_script(assume_metrics),
        suggesters=_suggesters(),
    )
    for event in _read_events(events):
        try:
            run.feed(event)
        except ValueError as exc:  # an event without time before any event set the clock
            typer.echo(f"{events}: skipped event {event.id!r}: {exc}", err=True)
    run.finish()
    return tuple(run.records)


def simulate_command(
    rules: Annotated[list[Path], typer.Option("--rules", help="Rule file or directory.")],
    events: Annotated[Path, typer.Option("--events", help="JSON Lines of CloudEvents.")],
    as_json: Annotated[bool, typer.Option("--json", help="One JSON record per line.")] = False,
    assume_duration: Annotated[
        str, typer.Option("--assume-duration", help="How long each launched job runs.")
    ] = "1h",
    assume_metrics: Annotated[
        Path | None,
        typer.Option(
            "--assume-metrics",
            help="What each sweep trial reports (YAML; docs/sweeps.md). Default: no metrics.",
        ),
    ] = None,
) -> None:
    """Replay events through the real engine, the clock following event time."""
    rule_set = _load(rules)
    records = _run(rule_set, events, assume_duration, assume_metrics)
    if as_json:
        for record in records:
            typer.echo(json.dumps(record.to_json(), sort_keys=True))
        return
    _print_table(records)
    launches = sum(1 for r in records if r.outcome is Outcome.LAUNCH)
    typer.echo(f"\n{len(records)} decision(s), {launches} launch(es)")


def _detail(record: DecisionRecord) -> str:
    if record.reason is Reason.TRIAL:  # its message names the parameters it tries
        return record.message
    if record.job is not None:
        return f"{record.job.name} runtime={record.job.runtime} dataset={record.job.dataset}"
    return record.message


def _print_table(records: Sequence[DecisionRecord]) -> None:
    rows = [("TIME", "RULE", "KEY", "OUTCOME", "REASON", "EVENTS", "DETAIL")]
    for record in records:
        rows.append(
            (
                format_time(record.time),
                record.rule,
                record.key or "-",
                record.outcome.value,
                record.reason.value if record.reason else "-",
                ",".join(record.event_ids),
                _detail(record),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(6)]
    for row in rows:
        typer.echo(
            "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=False))
            + "  "
            + row[6]
        )


def _read_records(path: Path) -> list[DecisionRecord]:
    records = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise _fail(f"{path}: cannot read: {exc}") from exc
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            records.append(DecisionRecord.from_json(json.loads(line)))
        except ValueError as exc:
            typer.echo(f"{path}:{number}: skipped: not a decision record: {exc}", err=True)
    return records


def _records_from_kafka(bootstrap: str, topic: str) -> list[DecisionRecord]:
    """Read the whole audit topic with kafka-python, decoding records as the service wrote
    them (either CloudEvents content mode); records that are not decisions are skipped."""
    from kafka import KafkaConsumer  # imported here: only this option needs a broker client

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=AUDIT_READ_IDLE_MS,
    )
    records = []
    try:
        for message in consumer:
            raw = KafkaRecord(
                value=message.value, headers=tuple(message.headers or ()), key=message.key
            )
            try:
                for event in decode_record(raw, max_event_bytes=AUDIT_MAX_EVENT_BYTES):
                    records.append(from_cloudevent(event))
            except InvalidEventError as exc:
                typer.echo(
                    f"{topic}@{message.partition}:{message.offset}: skipped: {exc}", err=True
                )
    finally:
        consumer.close()
    return sorted(records, key=lambda r: r.time)


def explain(
    rule: Annotated[str | None, typer.Option("--rule", help="Rule name.")] = None,
    key: Annotated[str | None, typer.Option("--key", help="The key (e.g. model id).")] = None,
    event: Annotated[
        str | None,
        typer.Option("--event", help="An event id: every rule's decision about it, or why not."),
    ] = None,
    records_path: Annotated[
        Path | None, typer.Option("--records", help="JSON Lines of decision records.")
    ] = None,
    rules: Annotated[
        list[Path] | None, typer.Option("--rules", help="Rules to simulate (with --events).")
    ] = None,
    events: Annotated[Path | None, typer.Option("--events", help="Events to simulate.")] = None,
    assume_duration: Annotated[str, typer.Option("--assume-duration")] = "1h",
    assume_metrics: Annotated[
        Path | None, typer.Option("--assume-metrics", help="Sweep trial outcomes (YAML).")
    ] = None,
    bootstrap: Annotated[
        str | None, typer.Option("--bootstrap", help="Kafka to read the audit topic from.")
    ] = None,
    topic: Annotated[str, typer.Option("--topic", help="The audit topic.")] = "tuneloop.audit",
    dead_letters: Annotated[
        str,
        typer.Option("--dead-letters", help="With --bootstrap and --event: the dead-letter topic."),
    ] = "tuneloop.dead-letters",
    as_json: Annotated[bool, typer.Option("--json")] = False,
) -> None:
    """The story of one rule and key, or of one event: what fired, what counted, or why not.

    With `--event` alone it answers for any event: every rule that named the event's type and
    what it decided (launched, counted, held back, ignored and why, failed), and with
    `--bootstrap` whether the intake dead-lettered it.
    """
    if rule is None and event is None:
        raise typer.BadParameter("give --rule (and --key), or --event, or both")
    if records_path is not None:
        records = _read_records(records_path)
    elif rules and events is not None:
        records = list(_run(_load(rules), events, assume_duration, assume_metrics))
    elif bootstrap is not None:
        records = _records_from_kafka(bootstrap, topic)
    else:
        raise typer.BadParameter("give --records FILE, --rules R --events E, or --bootstrap")
    story = [
        r
        for r in records
        if (rule is None or r.rule == rule)
        and (key is None or r.key == key)
        and (event is None or event in r.event_ids)
    ]
    if as_json:
        for record in story:
            typer.echo(json.dumps(record.to_json(), sort_keys=True))
        return
    if rule is None:
        assert event is not None  # checked above: one of the two is given
        letters = _dead_letters_of(bootstrap, dead_letters, event) if bootstrap is not None else []
        _explain_event(event, story, key=key, dead_lettered=letters)
        return
    subject = (
        f"rule {rule!r}"
        + (f", key {key!r}" if key else "")
        + (f", event {event!r}" if event else "")
    )
    if not story:
        known = sorted({r.rule for r in records})
        typer.echo(f"no decisions for {subject}. Rules with decisions: {', '.join(known) or '-'}")
        if event is not None:
            typer.echo(
                "The rule left no record about this event: it does not name the event's "
                "type, or its why-not record was left out by the per-rule limit (see "
                "`suppressed` in its next record; docs/rules.md, 'Why-not records')."
            )
        raise typer.Exit(1)
    typer.echo(f"Decisions for {subject}:")
    for record in story:
        typer.echo(f"  {_line(record)}")
    launches = [r for r in story if r.outcome is Outcome.LAUNCH]
    last = story[-1]
    typer.echo("")
    typer.echo(
        f"Launched {len(launches)} time(s)"
        + (f"; last job {launches[-1].job_name}" if launches else "")
    )
    if last.outcome is not Outcome.LAUNCH:
        typer.echo(
            f"Last decision: {last.outcome.value}"
            + (f" ({last.reason.value})" if last.reason else "")
            + f": {last.message}"
        )


def _line(record: DecisionRecord) -> str:
    reason = f" ({record.reason.value})" if record.reason else ""
    return (
        f"{format_time(record.time)}  {record.outcome.value}{reason}"
        f"  [{', '.join(record.event_ids)}]  {record.message}"
    )


_SAYS = {
    Outcome.ACCUMULATE: "counted it",
    Outcome.LAUNCH: "launched",
    Outcome.SUPPRESS: "held back",
    Outcome.DEFER: "deferred the launch",
    Outcome.LATE: "refused it as late",
    Outcome.CANCEL: "cancelled a job",
    Outcome.ERROR: "failed on it",
    Outcome.IGNORE: "ignored it",
    Outcome.PROMOTE: "promoted the adapter of the job it caused",
    Outcome.DECLINE: "kept the champion over the adapter of the job it caused",
    Outcome.CONCLUDE: "ended the sweep it caused",
}
"""What each outcome means, said of one event."""


def _explain_event(
    event: str,
    story: Sequence[DecisionRecord],
    *,
    key: str | None,
    dead_lettered: Sequence[DeadLetterReason] = (),
) -> None:
    """Every rule's decisions about *event*, one rule after another in order of first record;
    first, if the intake dead-lettered a record with this id, why."""
    for letter in dead_lettered:
        typer.echo(
            f"Event {event!r} was dead-lettered by the intake: {letter.code}: {letter.message}"
            f" (from {letter.topic}@{letter.partition}:{letter.offset})"
        )
    if dead_lettered and not story:
        return
    if not story:
        typer.echo(f"no decisions about event {event!r}.")
        typer.echo(
            "No rule names its type (the intake may also have dead-lettered it: see "
            "`tuneloop tail` on the dead-letter topic), or the rules' why-not records were "
            "left out by the per-rule limit (docs/rules.md, 'Why-not records')."
        )
        raise typer.Exit(1)
    by_rule: dict[str, list[DecisionRecord]] = {}
    for record in story:
        by_rule.setdefault(record.rule, []).append(record)
    typer.echo(f"Event {event!r}" + (f", key {key!r}" if key else "") + ":")
    for name, decided in by_rule.items():
        final = decided[-1]
        reason = f" ({final.reason.value})" if final.reason else ""
        where = f" for key {final.key!r}" if final.key else ""
        typer.echo(f"  rule {name!r}{where}: {_SAYS[final.outcome]}{reason}")
        for record in decided:
            typer.echo(f"    {_line(record)}")


def _dead_letters_of(bootstrap: str, topic: str, event_id: str) -> list[DeadLetterReason]:
    """Why the intake dead-lettered records whose CloudEvents id is *event_id*: the id read
    from the `ce_id` header (binary mode) or the JSON envelope (structured mode), since a
    dead-lettered record need not decode as a whole."""
    from kafka import KafkaConsumer  # imported here: only this option needs a broker client

    consumer = KafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        consumer_timeout_ms=AUDIT_READ_IDLE_MS,
        # the intake writes dead letters in transactions; an aborted one's are not letters
        isolation_level="read_committed",
    )
    found = []
    try:
        for message in consumer:
            headers = tuple(message.headers or ())
            if _record_event_id(original_headers(headers), message.value) == event_id:
                try:
                    found.append(read_reason(headers))
                except (KeyError, ValueError):  # not a record our intake wrote
                    continue
    finally:
        consumer.close()
    return found


def _record_event_id(headers: Sequence[tuple[str, bytes]], value: bytes | None) -> str | None:
    for name, raw in headers:
        if name == "ce_id":
            return raw.decode("utf-8", errors="replace")
    try:
        envelope = json.loads(value or b"")
    except ValueError:
        return None
    found = envelope.get("id") if isinstance(envelope, dict) else None
    return found if isinstance(found, str) else None


# --- rule tests as data -------------------------------------------------------------------


def _test_files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
    return [path]


def _job_difference(want: Mapping[str, Any], record: DecisionRecord) -> str | None:
    if record.job is None:
        return "no job in the record"
    job = job_to_json(record.job)
    for field, value in want.items():
        got = job.get(field)
        if isinstance(value, dict) and isinstance(got, dict):
            diff = {k: v for k, v in value.items() if got.get(k) != v}
            if diff:
                return f"job.{field}: expected {diff}, got {got}"
        elif got != value:
            return f"job.{field}: expected {value!r}, got {got!r}"
    return None


def _expectation_matches(expected: Mapping[str, Any], record: DecisionRecord) -> str | None:
    """None when *record* meets *expected*, else what differs."""
    actual = record.to_json()
    for name, want in expected.items():
        if name == "event":
            problem = (
                None
                if want in record.event_ids
                else (f"event {want!r} not in {list(record.event_ids)}")
            )
        elif name == "message_contains":
            problem = (
                None
                if str(want) in record.message
                else (f"message {record.message!r} lacks {want!r}")
            )
        elif name == "job":
            problem = _job_difference(want, record)
        elif name in actual:
            problem = (
                None
                if actual[name] == want
                else (f"{name}: expected {want!r}, got {actual[name]!r}")
            )
        else:
            problem = f"unknown expectation field {name!r}"
        if problem:
            return problem
    return None


def _run_case(rules: RuleSet, case: Mapping[str, Any]) -> list[str]:
    events = []
    for raw in case.get("events") or []:
        event = dict(raw)
        event.setdefault("specversion", "1.0")
        if "time" in event and not isinstance(event["time"], str):
            event["time"] = str(event["time"])
        events.append(_parse_event(event))
    duration = parse_duration(case.get("assume_duration", "1h"))
    script = None
    if case.get("assume_metrics") is not None:
        script = parse_script(case["assume_metrics"], parse_duration=parse_duration)
    records = simulate(
        rules,
        events,
        assume_duration=duration,
        assume_metrics=script,
        suggesters=_suggesters(),
    )
    expected = list(case.get("expect") or [])
    if not any(e.get("outcome") == Outcome.IGNORE.value for e in expected):
        # Why-not records say why a rule turned an event away. A case that expects none of
        # them is about what the rules did, so it reads as it did before they were recorded.
        records = tuple(r for r in records if r.outcome is not Outcome.IGNORE)
    wanted_rules = {e.get("rule") for e in expected if e.get("rule")}
    if wanted_rules:
        records = tuple(r for r in records if r.rule in wanted_rules)
    failures = []
    for index, want in enumerate(expected):
        if index >= len(records):
            failures.append(f"decision {index + 1}: expected {dict(want)}, got nothing")
            continue
        problem = _expectation_matches(want, records[index])
        if problem:
            failures.append(f"decision {index + 1} ({records[index].outcome.value}): {problem}")
    for record in records[len(expected) :]:
        failures.append(
            f"unexpected decision: {record.outcome.value} "
            f"{record.reason.value if record.reason else ''} {list(record.event_ids)}"
        )
    return failures


def run_rule_tests(
    rules: Annotated[list[Path], typer.Argument(help="Rule file or directory.")],
    tests: Annotated[Path, typer.Argument(help="A rule-test YAML file or a directory of them.")],
) -> None:
    """Run rule tests written as data (events + expected decisions); report each case."""
    rule_set = _load(rules)
    passed = failed = 0
    for path in _test_files(tests):
        try:
            document = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError) as exc:
            typer.echo(f"ERROR {path}: cannot read rule tests: {exc}")
            failed += 1
            continue
        cases = document.get("cases") if isinstance(document, dict) else None
        if not isinstance(cases, list):
            typer.echo(f"ERROR {path}: expected a mapping with a `cases:` list")
            failed += 1
            continue
        for number, case in enumerate(cases, start=1):
            name = (
                case.get("name", f"case {number}") if isinstance(case, dict) else f"case {number}"
            )
            try:
                failures = _run_case(rule_set, case)
            except (ValueError, TypeError, AttributeError) as exc:
                failures = [f"bad test case: {exc}"]
            if failures:
                failed += 1
                typer.echo(f"FAIL {path}: {name}")
                for failure in failures:
                    typer.echo(f"     {failure}")
            else:
                passed += 1
                typer.echo(f"PASS {path}: {name}")
    typer.echo(f"{passed} passed, {failed} failed")
    if failed or not passed:
        raise typer.Exit(1)
