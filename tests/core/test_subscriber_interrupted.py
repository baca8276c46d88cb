"""A waiter's subscription interrupted between its two records (a signal's exception: a
KeyboardInterrupt, a timeout alarm) leaves the subscriber consistent: the waiter can still
be unregistered. No process: the interruption comes before anything is sent."""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

import pytest

from django_redlock.wire.nodes import parse_node
from django_redlock.wire.sync.subscriber import Subscriber


class Interrupted(BaseException):
    """What a signal handler raises, at a line it cannot choose."""


def test_a_subscribe_interrupted_after_its_first_record_can_still_be_unregistered():
    subscriber = Subscriber([parse_node("redis://127.0.0.1:1/0")])
    waiter = subscriber.waiter_id()
    code = Subscriber.subscribe.__code__
    records: list[int] = []

    def interrupt_after_the_first_record(frame: FrameType, event: str, arg: Any) -> Any:
        # The line after the first write into users or listens: raise there.
        if frame.f_code is code and event == "line" and (subscriber.users or subscriber.listens):
            records.append(frame.f_lineno)
            raise Interrupted
        return interrupt_after_the_first_record

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        return interrupt_after_the_first_record if frame.f_code is code else None

    sys.settrace(tracer)
    try:
        with pytest.raises(Interrupted):
            subscriber.subscribe("redlock:name", timeout=0.01, waiter=waiter)
    finally:
        sys.settrace(None)
    assert records  # interrupted between the two records, not before or after both
    assert len(subscriber.users) + len(subscriber.listens) == 1
    subscriber.unregister(waiter)  # raised KeyError when listens was written first
    assert subscriber.listens == {}
