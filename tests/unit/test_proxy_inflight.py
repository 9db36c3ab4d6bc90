"""The recorder process's ledger of records in flight: the bounds `submit` meets, what an
acknowledgement frees, and what a child that dies takes with it."""

from __future__ import annotations

import threading

from triage.proxy.inflight import InFlight


def test_a_record_past_either_bound_is_refused_until_an_acknowledgement_frees_room() -> None:
    flight = InFlight(max_records=2, max_bytes=100)
    assert flight.admit(40) and flight.admit(40)
    assert not flight.admit(1)  # two records in flight: the record bound
    flight.acknowledge(1, 40)
    assert not flight.admit(61)  # 40 + 61 bytes: the byte bound
    assert flight.admit(60)
    assert (flight.submitted, flight.completed, flight.bytes) == (3, 1, 100)


def test_a_withdrawn_record_gives_its_room_back() -> None:
    flight = InFlight(max_records=1, max_bytes=100)
    assert flight.admit(100)
    flight.withdraw(100)
    assert (flight.submitted, flight.bytes) == (0, 0)
    assert flight.admit(100)


def test_a_dead_child_loses_what_it_had_not_finished_and_nothing_more_is_admitted() -> None:
    flight = InFlight(max_records=10, max_bytes=1000)
    for _ in range(3):
        assert flight.admit(10)
    flight.acknowledge(1, 10)
    assert flight.lose_the_rest() == 2
    # Lost records are acknowledged (nobody waits for them) but not completed: the journal
    # keeps them for the next start.
    assert (flight.lost, flight.completed, flight.acknowledged, flight.bytes) == (2, 1, 3, 0)
    assert not flight.admit(1)
    assert flight.wait(0.0) == 0


def test_wait_reports_what_is_still_outstanding_and_returns_once_acknowledged() -> None:
    flight = InFlight(max_records=10, max_bytes=1000)
    assert flight.admit(5) and flight.admit(5)
    assert flight.wait(0.0) == 2
    flight.acknowledge(1, 5)
    assert flight.wait(0.0) == 1
    results: list[int] = []
    waiting = threading.Thread(target=lambda: results.append(flight.wait(60.0)))
    waiting.start()
    flight.acknowledge(1, 5)
    waiting.join(60.0)
    assert results == [0]


def test_closing_wakes_a_waiter_without_counting_anything_lost() -> None:
    flight = InFlight(max_records=10, max_bytes=1000)
    assert flight.admit(5)
    results: list[int] = []
    waiting = threading.Thread(target=lambda: results.append(flight.wait(60.0)))
    waiting.start()
    flight.close()
    waiting.join(60.0)
    assert results == [0] and flight.lost == 0 and not flight.admit(1)
