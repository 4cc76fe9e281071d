"""Where a worker's CPU goes: py-spy samples of its process, summed per function.

`recording(pid, path)` runs `py-spy record` against a running process (an external sampler:
the worker's code is not touched, and `--nonblocking` never pauses it) until the block ends,
writing py-spy's raw format: one line per distinct stack, `frame;frame;...;leaf COUNT`, each
frame `function (file:line)`; with `--function` the line is the function's first, so one
function is one frame whatever line was running. py-spy leaves out the samples of threads
it sees idle (blocked in a system call), so the samples are close to CPU time.

`summarize` sums the stacks per function: *own* samples are those where the function was
the leaf (running its own code); *cumulative* those where it was anywhere on the stack below
the event loop's callback dispatch (counted once per stack, however often it recurses). The
frames down to that dispatch (`Handle._run`: `run_forever`, the CLI, `faust.Worker`) are on
every stack and say nothing, so cumulative counts start at the callback the loop ran.
`by_component` sums own samples per package (faust, aiokafka, asyncio, tuneloop's `handlers`
and `orchestrator`...). `markdown` writes the three as tables for docs/performance.md.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_FRAME = re.compile(r"^(?P<name>.*) \((?P<file>[^()]*):(?P<line>\d+)\)$")
_STDLIB = re.compile(r".*/lib/python\d+\.\d+/")
LOOP_DISPATCH = "Handle._run"
"""The event loop's frame that runs one callback; what is below it is the work."""


@dataclass(frozen=True, slots=True, order=True)
class Function:
    """One function as py-spy names it: name, file (shortened) and first line."""

    name: str
    file: str
    line: int

    @property
    def label(self) -> str:
        """The name, or what py-spy could not name (a native frame)."""
        return self.name or "(native code)"

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.file else ""


@dataclass(frozen=True, slots=True)
class Profile:
    """Samples per function: `own` where it was the leaf, `cumulative` where on the stack."""

    samples: int
    own: Counter[Function]
    cumulative: Counter[Function]


def short_path(path: str, root: Path = ROOT) -> str:
    """*path* as a reader finds it: inside a package (`faust/streams/stream.py`), the
    repository (`handlers/intake.py`) or the standard library (`asyncio/base_events.py`)."""
    if "site-packages/" in path:
        return path.rsplit("site-packages/", 1)[1]
    prefix = f"{root}/"
    if path.startswith(prefix):
        return path[len(prefix) :]
    return _STDLIB.sub("", path)


def _function(frame: str, root: Path) -> Function:
    found = _FRAME.match(frame)
    if found is None:
        return Function(frame, "", 0)
    return Function(found["name"], short_path(found["file"], root), int(found["line"]))


def _below_the_loop(frames: list[Function]) -> list[Function]:
    """The frames after the last callback dispatch of an event loop (all, if none is)."""
    for index in range(len(frames) - 1, -1, -1):
        if frames[index].name == LOOP_DISPATCH:
            return frames[index + 1 :] or frames[index:]
    return frames


def summarize(raw: str, *, root: Path = ROOT) -> Profile:
    """The per-function sums of py-spy's raw output *raw* (blank lines skipped)."""
    own: Counter[Function] = Counter()
    cumulative: Counter[Function] = Counter()
    samples = 0
    for line in raw.splitlines():
        if not line.strip():
            continue
        stack, count_text = line.rsplit(" ", 1)
        count = int(count_text)
        frames = [_function(frame, root) for frame in stack.split(";")]
        samples += count
        own[frames[-1]] += count
        for function in set(_below_the_loop(frames)):
            cumulative[function] += count
    return Profile(samples=samples, own=own, cumulative=cumulative)


def component(function: Function) -> str:
    """The package or module *function* belongs to: `faust`, `aiokafka`, `asyncio`,
    `handlers`, `json`, ...; `(native code)` for a frame without a file, `(interpreter)` for
    frozen modules and generated code (`<string>`, `<frozen runpy>`)."""
    if not function.file:
        return "(native code)"
    if function.file.startswith("<"):
        return "(interpreter)"
    first = function.file.split("/", 1)[0]
    return first.removesuffix(".py")


def by_component(profile: Profile) -> Counter[str]:
    """Own samples summed per `component`: which library the CPU time is spent in."""
    shares: Counter[str] = Counter()
    for function, count in profile.own.items():
        shares[component(function)] += count
    return shares


def _share(count: int, total: int) -> str:
    return f"{100 * count / total:.1f} %" if total else "-"


def markdown(profile: Profile, *, top: int = 15) -> str:
    """Two tables: the *top* functions by own samples, and by cumulative samples."""
    if not profile.samples:
        return "py-spy recorded no samples.\n"
    total = profile.samples
    lines = [
        f"Own time by package or module, of {total:,} samples:",
        "",
        "| package | own |",
        "| --- | --- |",
    ]
    lines += [
        f"| {name} | {_share(count, total)} |"
        for name, count in by_component(profile).most_common(top)
    ]
    lines += [
        "",
        f"Top {top} functions by own time (the function's own code was running):",
        "",
        "| # | function | where | own | cumulative |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rank, (function, count) in enumerate(profile.own.most_common(top), start=1):
        lines.append(
            f"| {rank} | `{function.label}` | {function.where} | "
            f"{_share(count, total)} | {_share(profile.cumulative[function], total)} |"
        )
    lines += [
        "",
        f"Top {top} functions by cumulative time (anywhere on the stack below the event "
        "loop's dispatch: the main paths):",
        "",
        "| # | function | where | cumulative | own |",
        "| --- | --- | --- | --- | --- |",
    ]
    for rank, (function, count) in enumerate(profile.cumulative.most_common(top), start=1):
        lines.append(
            f"| {rank} | `{function.label}` | {function.where} | "
            f"{_share(count, total)} | {_share(profile.own[function], total)} |"
        )
    return "\n".join(lines) + "\n"


def py_spy() -> str | None:
    """The py-spy program beside this Python (the virtual environment's), or on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


@contextlib.contextmanager
def recording(pid: int, path: Path, *, rate: int = 200) -> Iterator[None]:
    """Sample process *pid* with py-spy while the block runs; raw stacks land in *path*.

    Raises:
        FileNotFoundError: py-spy is not installed (`pip install py-spy`, in the dev extra).
    """
    program = py_spy()
    if program is None:
        raise FileNotFoundError("py-spy is not installed (pip install py-spy)")
    command = [program, "record", "--pid", str(pid), "--format", "raw", "--function"]
    command += ["--nonblocking", "--rate", str(rate), "--output", str(path)]
    sampler = subprocess.Popen(
        command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        yield
    finally:
        # py-spy writes what it sampled when interrupted, as on Ctrl-C
        sampler.send_signal(signal.SIGINT)
        try:
            output, _ = sampler.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            sampler.kill()
            output, _ = sampler.communicate()
        if not path.exists():
            print(
                f"bench: py-spy wrote nothing: {output.decode(errors='replace')[-500:]}",
                file=sys.stderr,
            )
