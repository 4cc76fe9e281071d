"""`make bench`: run every benchmark in one go, print one table, write docs/performance.md.

Each area's module (`bench/engine.py`, `bench/intake.py`, ...) exposes
`run(*, quick: bool) -> list[dict[str, object]] | report.Results` (rows, or rows and sections
of text for the page, such as the worker's profile). Rows put a measurement next to a baseline
measured in the same run on the same machine, so the ratio is what to read; absolute numbers
are context. A module that fails is reported as a failed row, and the others still run.

Each row's `goal` is a comparison on its ratio or value (`bench/goals.py`); the `met` column
(`bench/report.py`) says whether the measurement met it (yes / no), blank for context rows.
A goal that cannot be checked fails the run, as a failed module does.

Usage: python -m bench [--quick] [--only engine,intake] [--no-write]
"""

from __future__ import annotations

import argparse
import importlib
import platform
import subprocess
import sys
import time
import traceback
from datetime import UTC, datetime
from pathlib import Path

from bench import report

AREAS = ("engine", "intake", "worker", "launch", "trainer", "endtoend", "footprint")
REPORT = Path(__file__).resolve().parent.parent / "docs" / "performance.md"


def _machine() -> str:
    try:
        cpu = next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    cores = subprocess.run(["nproc"], capture_output=True, text=True, check=False).stdout.strip()
    return f"{cpu}, {cores} cores, Python {platform.python_version()}, {platform.system()}"


def _versions() -> str:
    from importlib import metadata

    names = ("faust-streaming", "aiokafka", "kubernetes", "torch", "transformers", "peft")
    found = []
    for name in names:
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            continue
    return ", ".join(found)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench")
    parser.add_argument("--quick", action="store_true", help="smaller inputs, for a smoke run")
    parser.add_argument("--only", default="", help="comma-separated areas: " + ",".join(AREAS))
    parser.add_argument("--no-write", action="store_true", help="do not rewrite the report")
    args = parser.parse_args(argv)
    areas = [a for a in args.only.split(",") if a] or list(AREAS)

    rows: list[dict[str, object]] = []
    sections: list[report.Section] = []
    timings: list[str] = []
    failed = 0
    for area in areas:
        started = time.monotonic()
        print(f"bench: {area} ...", file=sys.stderr, flush=True)
        try:
            module = importlib.import_module(f"bench.{area}")
        except ModuleNotFoundError as exc:
            if exc.name == f"bench.{area}":
                print(f"bench: {area}: no benchmark module yet, skipped", file=sys.stderr)
                continue
            raise
        try:
            result = module.run(quick=args.quick)
            if isinstance(result, report.Results):
                rows.extend(result.rows)
                sections.extend(result.sections)
            else:
                rows.extend(result)
        except Exception as exc:  # one broken benchmark must not hide the others
            failed += 1
            traceback.print_exc()
            rows.append({"benchmark": area, "measure": "FAILED", "notes": repr(exc)[:200]})
        timings.append(f"{area} {time.monotonic() - started:.0f} s")
        print(f"bench: {area} done in {timings[-1].split(' ', 1)[1]}", file=sys.stderr)

    table, unreadable = report.table(rows)
    failed += unreadable
    summary = report.met_summary(rows)
    print(table)
    print(summary)
    for section in sections:
        print(f"\n## {section.title}\n\n{section.body}")
    if not args.no_write:
        date = f"{datetime.now(UTC):%Y-%m-%d %H:%M} UTC{' (quick mode)' if args.quick else ''}"
        REPORT.write_text(
            report.page(
                table,
                date=date,
                machine=_machine(),
                versions=_versions(),
                timings=", ".join(timings),
                summary=summary,
                sections=sections,
            )
        )
        print(f"bench: wrote {REPORT}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
