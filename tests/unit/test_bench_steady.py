"""The steady part of a benchmark run: events, seconds and CPU between 10 % and 90 % done."""

from __future__ import annotations

import math

import pytest

from bench.steady import IncompleteRunError, Sample, span


def test_a_run_at_a_constant_pace_gives_that_pace_whatever_its_start_up():
    # 2 s of start-up with nothing done, then 100 events a second and 5 ms of CPU per event,
    # on top of 1.5 CPU seconds of start-up
    samples = [Sample(at=t / 10, done=0, cpu=1.5 * t / 20) for t in range(21)]
    samples += [Sample(at=2 + t / 10, done=10 * t, cpu=1.5 + 0.05 * t) for t in range(1, 101)]
    steady = span(samples, 1000)
    assert steady.events == pytest.approx(800)
    assert steady.seconds == pytest.approx(8.0)
    assert steady.rate == pytest.approx(100.0)
    assert steady.cpu_per_event == pytest.approx(0.005)


def test_the_cut_falls_between_two_samples_by_linear_interpolation():
    # 0 -> 40 events between t=1 and t=2 (CPU 0 -> 4); 40 -> 100 between t=2 and t=5 (4 -> 10)
    samples = [
        Sample(0.0, 0, 0.0),
        Sample(1.0, 0, 0.0),
        Sample(2.0, 40, 4.0),
        Sample(5.0, 100, 10.0),
    ]
    steady = span(samples, 100)
    # 10 events at t = 1.25 (CPU 1.0); 90 events at t = 2 + 3 * 50/60 = 4.5 (CPU 9.0)
    assert steady.seconds == pytest.approx(3.25)
    assert steady.cpu == pytest.approx(8.0)
    assert steady.events == pytest.approx(80)


def test_samples_out_of_order_are_read_in_time_order():
    samples = [Sample(2.0, 100, 2.0), Sample(0.0, 0, 0.0), Sample(1.0, 50, 1.0)]
    assert span(samples, 100).seconds == pytest.approx(1.6)


def test_a_run_that_never_reached_ninety_percent_has_no_steady_span():
    samples = [Sample(0.0, 0, 0.0), Sample(1.0, 80, 1.0)]
    with pytest.raises(IncompleteRunError, match="80"):
        span(samples, 100)


def test_no_samples_is_no_span():
    with pytest.raises(IncompleteRunError):
        span([], 100)


def test_an_empty_span_has_no_rate():
    steady = span([Sample(0.0, 100, 1.0)], 100)
    assert math.isnan(steady.rate)
