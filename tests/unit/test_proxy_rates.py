"""Failure signatures and the sequential change detection of the live proxy (pure)."""

from __future__ import annotations

import pytest

from triage.proxy.rates import MIN_FAILURES, detect, failure_signature, signature_kinds


def test_signature_is_sorted_kinds_and_status_class() -> None:
    assert failure_signature(["length-stop", "empty-content"], 200) == (
        "empty-content+length-stop|2xx"
    )
    assert failure_signature(["http-error"], 503) == "http-error|5xx"
    assert failure_signature(["timeout"], None, transport=True) == "timeout|transport"
    assert failure_signature([], 200) == ""
    assert signature_kinds("empty-content+length-stop|2xx") == ["empty-content", "length-stop"]


def test_a_new_signature_at_a_quarter_of_the_traffic_raises_an_alarm() -> None:
    detection = detect(6, 24, 0, 0)
    assert detection.alarm and detection.new
    assert detection.llr >= detection.upper
    low, high = detection.interval
    assert low < 0.25 < high


def test_one_or_two_failures_never_raise_an_alarm_however_rare_before() -> None:
    for k in range(MIN_FAILURES):
        assert not detect(k, k, 0, 10_000).alarm


def test_a_steady_rate_is_no_change_and_a_doubled_rate_is_an_alarm() -> None:
    steady = detect(25, 100, 250, 1000)
    assert steady.verdict == "no-change"
    assert not steady.new
    risen = detect(60, 100, 250, 1000)
    assert risen.alarm and not risen.new


def test_few_exchanges_keep_the_test_going() -> None:
    assert detect(1, 4, 20, 100).verdict == "continue"


def test_the_test_has_its_nominal_false_alarm_rate_on_a_steady_rate() -> None:
    # Same 20% rate in the window as in the trailing data: alarms must be rare (< 1%).
    from scipy.stats import binom

    n, trailing_k, trailing_n = 100, 200, 1000
    alarm_probability = sum(
        binom.pmf(k, n, 0.2) for k in range(n + 1) if detect(k, n, trailing_k, trailing_n).alarm
    )
    assert alarm_probability < 0.01


def test_counts_are_checked() -> None:
    with pytest.raises(ValueError):
        detect(5, 3, 0, 0)
