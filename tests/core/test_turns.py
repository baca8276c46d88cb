"""core.turns: one at a time on an auto-extended lease, with a flag per lease and one condition
per process. The leases' own paths (extend, release, renewal, fork) are tested on real nodes
in test_flow_parity.py, test_fork.py and test_async_cancel.py; this checks the rules the
module promises, on stand-ins that have only the flag."""

from __future__ import annotations

import os
import threading

import pytest

from django_redlock.core import turns
from tests.core.test_fork import in_child_while_held


class Flagged:
    def __init__(self) -> None:
        self._guard: bool | None = False


def test_a_turn_is_taken_once_until_it_is_given_back():
    lease = Flagged()
    assert not turns.is_taken(lease)
    assert turns.try_take(lease)
    assert turns.is_taken(lease)
    assert not turns.try_take(lease)
    turns.give_back(lease)
    assert not turns.is_taken(lease)
    assert turns.try_take(lease)
    turns.give_back(lease)


def test_a_waiter_gets_the_turn_when_it_is_given_back():
    lease = Flagged()
    turns.take(lease)
    got = threading.Event()

    def waiter() -> None:
        turns.take(lease)
        got.set()
        turns.give_back(lease)

    thread = threading.Thread(target=waiter)
    thread.start()
    thread.join(0.05)
    assert not got.is_set()  # still our turn
    turns.give_back(lease)
    thread.join(10.0)
    assert got.is_set()
    assert not turns.is_taken(lease)


def test_a_lease_never_waits_for_another_leases_turn():
    # One condition serves every lease, but only the flag of one's own lease is waited for:
    # a renewal in flight on one lease holds up no call on another.
    busy, other = Flagged(), Flagged()
    turns.take(busy)
    try:
        done = threading.Event()

        def caller() -> None:
            turns.take(other)
            turns.give_back(other)
            done.set()

        thread = threading.Thread(target=caller)
        thread.start()
        thread.join(10.0)
        assert done.is_set()
        assert turns.is_taken(busy)
    finally:
        turns.give_back(busy)


def test_waiters_on_different_leases_each_wake_for_their_own():
    first, second = Flagged(), Flagged()
    turns.take(first)
    turns.take(second)
    order: list[str] = []

    def waiter(lease: Flagged, name: str) -> None:
        turns.take(lease)
        order.append(name)
        turns.give_back(lease)

    threads = [
        threading.Thread(target=waiter, args=(first, "first")),
        threading.Thread(target=waiter, args=(second, "second")),
    ]
    for thread in threads:
        thread.start()
    turns.give_back(second)  # wakes both; only the second's waiter goes on
    threads[1].join(10.0)
    assert order == ["second"]
    assert threads[0].is_alive()
    turns.give_back(first)
    threads[0].join(10.0)
    assert order == ["second", "first"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() only")
def test_a_forked_child_takes_turns_although_a_parent_thread_held_the_condition():
    # A parent thread inside the condition at the instant of the fork would leave the child's
    # copy of it locked for good: the child gets a new one.
    def body() -> int:
        lease = Flagged()
        if turns.try_take(lease):
            turns.give_back(lease)
            return 0
        return 1

    status = in_child_while_held(turns._condition, body)  # HUNG if the turn never came
    assert status == 0
