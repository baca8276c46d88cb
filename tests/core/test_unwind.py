"""An error raised in a driver's own frame between two effects (a signal handler's interrupt
at the loop's back edge, the instant a won round's SETs are on the nodes) has no effect to be
thrown into: the driver throws it into the procedure with ``unwind``, so the procedure's
clean-ups go out (found by review: the procedure was left suspended, the collector closed
it, and the lock stayed on every node for its whole ttl). The real acquire procedure, driven
by hand as in test_procedures.py, with no server."""

from __future__ import annotations

import inspect
from collections.abc import Sequence

import pytest

from django_redlock import LockContended
from django_redlock.procedures.effects import LISTEN, Round, unwind
from django_redlock.wire.asyncio import driver as async_driver
from django_redlock.wire.scripts import Command
from django_redlock.wire.sync import driver as sync_driver
from tests.core.test_procedures import answer, manager, start

__all__ = ["manager"]


def test_unwind_throws_into_a_single_try_left_at_its_round(manager):
    procedure = start(manager, blocking=False)
    assert type(next(procedure)) is Round  # the SETs are out; an interrupt lands here
    posted: list[Sequence[Command | None]] = []
    unwind(procedure, KeyboardInterrupt(), posted.append)
    assert inspect.getgeneratorstate(procedure) == inspect.GEN_CLOSED
    (releases,) = posted  # a single try never queued: no leave
    assert len(releases) == 3
    assert all(command is not None for command in releases)  # every node: any SET may land


def test_unwind_throws_into_a_waiter_and_it_leaves_the_line(manager):
    procedure = start(manager, blocking=True)
    assert next(procedure) is LISTEN
    assert type(procedure.send("waiter.1")) is Round
    posted: list[Sequence[Command | None]] = []
    unwind(procedure, KeyboardInterrupt(), posted.append)
    releases, leave = posted
    assert all(command is not None for command in releases)
    assert all(command is not None for command in leave)  # its place, on every node
    assert inspect.getgeneratorstate(procedure) == inspect.GEN_CLOSED


def test_unwind_of_an_ended_or_unstarted_procedure_does_nothing(manager):
    posted: list[object] = []
    unstarted = start(manager, blocking=False)
    unwind(unstarted, KeyboardInterrupt(), posted.append)
    assert posted == []
    unstarted.close()
    ended = start(manager, blocking=False)
    next(ended)
    ended.send(answer([2500, 2500, 2500], 0))  # lost: the clean-up post
    with pytest.raises(LockContended):
        ended.send(None)
    unwind(ended, KeyboardInterrupt(), posted.append)
    assert posted == []


def test_both_drivers_unwind_what_escapes_their_frame():
    """The drivers' loops end in ``except BaseException`` that hands the procedure to
    ``unwind`` before re-raising (the only way an error raised between two effects reaches
    the procedure)."""
    for driver in (sync_driver, async_driver):
        source = inspect.getsource(driver.drive)
        assert "except BaseException as escaping:" in source
        assert "unwind(procedure, escaping, connections.post)" in source
