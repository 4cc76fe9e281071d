"""Benchmarks: `make bench` runs them all and writes docs/performance.md.

Each `bench/<area>.py` exposes `run(*, quick: bool) -> list[dict[str, object]]`; every row is a
measurement next to a baseline measured in the same run, so the ratio means something on any
machine.
"""
