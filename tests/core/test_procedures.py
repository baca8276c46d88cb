"""The procedures (``django_redlock/procedures/``) driven by hand through scripted replies, with
no server: what each yields, in what order, and what it does when an error is thrown in. The
engine is a real one (its nodes are never contacted: the procedures do no I/O)."""

from __future__ import annotations

from collections.abc import Generator, Sequence
from functools import partial
from types import SimpleNamespace
from typing import Any

import pytest

from django_redlock import LockContended, LockManager, LockNotAcquired
from django_redlock.core.owner import owner_scope
from django_redlock.procedures import acquire as acquire_procedure
from django_redlock.procedures.effects import (
    LISTEN,
    Effect,
    Grants,
    Post,
    Round,
    Sleep,
    Subscribe,
    Wait,
)
from django_redlock.procedures.options import Checked
from django_redlock.procedures.shapes import Shape
from django_redlock.redlock import Lease
from django_redlock.wire.errors import TIMED_OUT
from django_redlock.wire.scripts import GRANTED

URLS = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]
LOST = 2500  # acquire.lua's refusal: the ms the holder has left


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def manager() -> Generator[LockManager, None, None]:
    clock = Clock()
    made = LockManager(URLS, ttl=10.0, clock=clock, retry_delay=0.2, default_timeout=1.0)
    # Every node heard already: no first contact (its round is tested below on its own).
    made.engine.quarantine.heard.update(address.label for address in made.engine.addresses)
    yield made
    made.close()


def finish(procedure: Generator[Effect, Any, Any]) -> None:
    """End a procedure left mid-way as a driver would on an interrupt (throw it in, carry out
    nothing of what its clean-ups ask), rather than leave it to the collector."""
    try:
        procedure.throw(KeyboardInterrupt())
        while True:
            procedure.send(None)
    except KeyboardInterrupt:
        return


def answer(results: Sequence[Any], yes: int) -> SimpleNamespace:
    return SimpleNamespace(results=list(results), yes=yes)


def start(
    manager: LockManager, *, blocking: bool, wait: float | None = 1.0
) -> Generator[Effect, Any, Lease]:
    checked = Checked(10.0, blocking, wait, False, None, None)
    engine = manager.engine
    return acquire_procedure.acquire(
        engine,
        partial(Lease, manager),
        "procedure",
        Shape(engine.key_prefix + "procedure"),
        owner_scope(),
        checked,
        True,
    )


def test_a_single_try_won_at_once_is_one_round_and_no_clean_up(manager):
    procedure = start(manager, blocking=False)
    first = next(procedure)
    assert type(first) is Round
    assert len(first.commands) == 3
    assert first.identify
    with pytest.raises(StopIteration) as done:
        procedure.send(answer([GRANTED] * 3, 3))
    lease = done.value.value
    assert isinstance(lease, Lease)
    assert 9.0 < lease.validity <= 10.0
    lease._depth = 0  # not released through the nodes: none is running


def test_a_lost_single_try_posts_its_clean_up_then_raises_contended(manager):
    procedure = start(manager, blocking=False)
    next(procedure)
    clean_up = procedure.send(answer([LOST, LOST, TIMED_OUT], 0))
    # The node that did not answer may still run the SET: it gets the release; the nodes
    # that refused wrote nothing of ours.
    assert type(clean_up) is Post
    assert [command is not None for command in clean_up.commands] == [False, False, True]
    with pytest.raises(LockContended):
        procedure.send(None)


def test_a_round_interrupted_posts_the_releases_of_every_node_then_leaves_the_line(manager):
    procedure = start(manager, blocking=True)
    assert next(procedure) is LISTEN
    assert type(procedure.send("waiter.1")) is Round
    interrupted = procedure.throw(KeyboardInterrupt())
    assert type(interrupted) is Post
    assert all(command is not None for command in interrupted.commands)
    leave = procedure.send(None)
    assert type(leave) is Post  # the place in line, left on every node
    assert len(leave.commands) == 3
    with pytest.raises(KeyboardInterrupt):
        procedure.send(None)


def test_a_waiter_subscribes_tries_again_at_once_then_waits_then_gives_up(manager):
    clock = manager.engine.clock
    procedure = start(manager, blocking=True, wait=1.0)
    assert next(procedure) is LISTEN
    procedure.send("waiter.1")
    assert type(procedure.send(answer([LOST] * 3, 0))) is Post  # the clean-up
    subscribe = procedure.send(None)
    assert type(subscribe) is Subscribe
    assert subscribe.waiter == "waiter.1"
    again = procedure.send(True)  # subscribed just now: try at once
    assert type(again) is Round
    assert type(procedure.send(answer([LOST] * 3, 0))) is Post
    wait = procedure.send(None)
    assert type(wait) is Wait
    assert wait.waiter == "waiter.1"
    assert wait.need == 2  # a plain lock's waiter takes hand-off grants: a quorum ends it
    assert type(procedure.send(False)) is Grants
    clock.now += 2.0  # past the deadline
    assert type(procedure.send({})) is Round
    assert type(procedure.send(answer([LOST] * 3, 0))) is Post
    leave = procedure.send(None)
    assert type(leave) is Post
    with pytest.raises(LockNotAcquired):
        procedure.send(None)


def test_a_waiter_granted_by_a_quorum_while_it_waits_holds_with_no_round(manager):
    procedure = start(manager, blocking=True, wait=5.0)
    next(procedure)
    procedure.send("waiter.1")
    procedure.send(answer([LOST] * 3, 0))  # -> the clean-up
    procedure.send(None)  # -> subscribe
    procedure.send(True)  # -> round 2
    procedure.send(answer([LOST] * 3, 0))  # -> the clean-up
    assert type(procedure.send(None)) is Wait
    assert type(procedure.send(True)) is Grants
    with pytest.raises(StopIteration) as done:
        procedure.send({0: 2, 1: 2})  # two nodes granted round 2 (hand_grant.lua)
    lease = done.value.value
    assert isinstance(lease, Lease)
    assert lease.validity > 0
    lease._depth = 0


def test_a_try_that_cannot_hear_releases_sleeps(manager):
    engine = manager.engine
    procedure = acquire_procedure.acquire(
        engine,
        partial(Lease, manager),
        "procedure",
        Shape(engine.key_prefix + "procedure"),
        owner_scope(),
        Checked(10.0, True, 1.0, False, None, None),
        False,  # the manager was given a sleep function
    )
    next(procedure)
    procedure.send("waiter.1")
    procedure.send(answer([LOST] * 3, 0))
    sleep = procedure.send(None)
    assert type(sleep) is Sleep
    assert 0.0 < sleep.delay <= 1.0
    finish(procedure)


def test_the_first_contact_comes_before_the_acquire_begins(manager):
    engine = manager.engine
    engine.quarantine.heard.clear()
    procedure = start(manager, blocking=False)
    contact = next(procedure)
    assert type(contact) is Round
    assert contact.yes == b"PONG"
    engine.clock.now += 5.0  # a slow contact: not counted against the acquire
    first = procedure.send(answer([b"PONG"] * 3, 3))
    assert type(first) is Round
    assert first.yes != b"PONG"
    finish(procedure)
