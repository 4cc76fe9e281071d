"""The worker's profile in docs/performance.md: py-spy's raw stacks summed per function."""

from __future__ import annotations

from pathlib import Path

from bench.profiling import Function, by_component, markdown, short_path, summarize

ROOT = Path("/work/repo")
SITE = "/work/repo/.venv/lib/python3.11/site-packages"
STDLIB = "/usr/lib/python3.11"

# Hand-written in py-spy's raw format (`--function`): 10 samples in all.
LOOP = (
    f"run_forever ({STDLIB}/asyncio/base_events.py:593);Handle._run ({STDLIB}/asyncio/events.py:78)"
)
RAW = f"""\
{LOOP};handle ({ROOT}/handlers/app.py:400);decode ({ROOT}/handlers/codec.py:120) 4
{LOOP};handle ({ROOT}/handlers/app.py:400) 1
{LOOP};wait_first ({SITE}/mode/services.py:700) 3
walk ({ROOT}/orchestrator/x.py:10);walk ({ROOT}/orchestrator/x.py:10) 2

"""

RUN_FOREVER = Function("run_forever", "asyncio/base_events.py", 593)
DISPATCH = Function("Handle._run", "asyncio/events.py", 78)
HANDLE = Function("handle", "handlers/app.py", 400)
DECODE = Function("decode", "handlers/codec.py", 120)
WAIT_FIRST = Function("wait_first", "mode/services.py", 700)
WALK = Function("walk", "orchestrator/x.py", 10)


def test_own_samples_are_the_leaf_frames():
    profile = summarize(RAW, root=ROOT)
    assert profile.samples == 10
    assert profile.own == {DECODE: 4, HANDLE: 1, WAIT_FIRST: 3, WALK: 2}


def test_cumulative_samples_count_every_function_below_the_loop_once_per_stack():
    profile = summarize(RAW, root=ROOT)
    assert profile.cumulative[HANDLE] == 5
    assert profile.cumulative[DECODE] == 4
    assert profile.cumulative[WALK] == 2  # recursion counted once per stack


def test_the_frames_down_to_the_loops_dispatch_are_left_out_of_cumulative():
    profile = summarize(RAW, root=ROOT)
    assert profile.cumulative[RUN_FOREVER] == 0
    assert profile.cumulative[DISPATCH] == 0


def test_the_loops_own_dispatch_time_is_still_its_own():
    profile = summarize(f"{LOOP} 7\n", root=ROOT)
    assert profile.own == {DISPATCH: 7}
    assert profile.cumulative[DISPATCH] == 7


def test_paths_are_shortened_to_where_a_reader_finds_the_file():
    assert short_path(f"{SITE}/faust/streams/stream.py", ROOT) == "faust/streams/stream.py"
    assert short_path(f"{ROOT}/handlers/intake.py", ROOT) == "handlers/intake.py"
    assert short_path(f"{STDLIB}/asyncio/events.py", ROOT) == "asyncio/events.py"
    assert short_path("<frozen importlib._bootstrap>", ROOT) == "<frozen importlib._bootstrap>"


def test_a_frame_without_a_file_keeps_its_name():
    profile = summarize("<native> 3\n", root=ROOT)
    assert profile.own == {Function("<native>", "", 0): 3}


def test_a_frame_py_spy_could_not_name_is_shown_as_native_code():
    text = markdown(summarize(" (:0) 3\n", root=ROOT))
    assert "| 1 | `(native code)` |  | 100.0 % | 100.0 % |" in text


def test_the_tables_rank_by_own_then_by_cumulative_share():
    text = markdown(summarize(RAW, root=ROOT), top=2)
    own_table, cumulative_table = text.split("by cumulative time")
    own_rows = [
        line
        for line in own_table.splitlines()
        if line.startswith("| 1 ") or line.startswith("| 2 ")
    ]
    assert own_rows == [
        "| 1 | `decode` | handlers/codec.py:120 | 40.0 % | 40.0 % |",
        "| 2 | `wait_first` | mode/services.py:700 | 30.0 % | 30.0 % |",
    ]
    cumulative_rows = [
        line for line in cumulative_table.splitlines() if line.startswith(("| 1 ", "| 2 "))
    ]
    assert cumulative_rows == [
        "| 1 | `handle` | handlers/app.py:400 | 50.0 % | 10.0 % |",
        "| 2 | `decode` | handlers/codec.py:120 | 40.0 % | 40.0 % |",
    ]


def test_no_samples_says_so():
    assert "no samples" in markdown(summarize("", root=ROOT))


def test_own_time_is_summed_per_package_or_module():
    profile = summarize(RAW + " (:0) 1\n<module> (<string>:1) 1\n", root=ROOT)
    assert by_component(profile) == {
        "handlers": 5,
        "mode": 3,
        "orchestrator": 2,
        "(native code)": 1,
        "(interpreter)": 1,
    }


def test_the_page_shows_the_packages_first():
    text = markdown(summarize(RAW, root=ROOT), top=2)
    assert text.index("| handlers | 50.0 % |") < text.index("| mode | 30.0 % |")
    assert text.index("| mode | 30.0 % |") < text.index("functions by own time")
