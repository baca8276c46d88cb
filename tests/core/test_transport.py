"""The sync and asyncio transports have one interface (``wire/transport.py``): the same
public methods, with the same parameters, in both, and in their subscribers; and one round
rule (``wire/rounds.py``).

The interface checks read the classes (mypy checks the rest: ``_conforms``); the round rule
is checked on real nodes.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any

import pytest

from django_redlock import AsyncLockManager, LockManager
from django_redlock.wire.asyncio.connections import LoopConnections, LoopSubscriber
from django_redlock.wire.errors import PENDING, TIMED_OUT, NodeError
from django_redlock.wire.resp import ReplyError
from django_redlock.wire.rounds import RECORD, RELOAD, RESEND, Round, on_reply
from django_redlock.wire.scripts import Fallback
from django_redlock.wire.stall import StallRule
from django_redlock.wire.sync.connections import ConnectionSet
from django_redlock.wire.sync.subscriber import Subscriber
from django_redlock.wire.transport import (
    AsyncTransport,
    AsyncWakeSubscriber,
    Transport,
    WakeSubscriber,
)

# What the managers call; the constructors and the transports' own helpers may differ.
PAIRS = [
    (ConnectionSet, LoopConnections, Transport, AsyncTransport),
    (Subscriber, LoopSubscriber, WakeSubscriber, AsyncWakeSubscriber),
]


def _conforms(
    sync: ConnectionSet, aio: LoopConnections, subscriber: Subscriber, loop: LoopSubscriber
) -> None:
    """Never called: mypy fails here if a transport does not satisfy its Protocol."""
    transport: Transport = sync
    async_transport: AsyncTransport = aio
    wake: WakeSubscriber = subscriber
    async_wake: AsyncWakeSubscriber = loop
    del transport, async_transport, wake, async_wake


def _public(cls: type) -> dict[str, Any]:
    """The public methods and properties a class defines (its constructor aside)."""
    names = {}
    for name, member in inspect.getmembers(cls):
        if name.startswith("_"):
            continue
        if inspect.isfunction(member) or isinstance(member, property):
            names[name] = member
    return names


def _parameters(member: Any) -> list[tuple[str, Any, Any]]:
    """(name, kind, default) of each parameter; a property has none."""
    if isinstance(member, property):
        return []
    return [(p.name, p.kind, p.default) for p in inspect.signature(member).parameters.values()]


@pytest.mark.parametrize(("sync", "aio", "protocol", "async_protocol"), PAIRS)
def test_both_transports_have_the_protocols_methods_with_the_same_parameters(
    sync: type, aio: type, protocol: type, async_protocol: type
) -> None:
    wanted = set(_public(protocol))
    assert wanted == set(_public(async_protocol))
    for cls in (sync, aio):
        methods = _public(cls)
        assert wanted <= set(methods), (cls.__name__, wanted - set(methods))
    sync_methods, aio_methods = _public(sync), _public(aio)
    for name in sorted(wanted):
        assert _parameters(sync_methods[name]) == _parameters(aio_methods[name]), name
        assert _parameters(sync_methods[name]) == _parameters(_public(protocol)[name]), name
        assert inspect.iscoroutinefunction(aio_methods[name]) == inspect.iscoroutinefunction(
            _public(async_protocol)[name]
        ), name


@pytest.mark.parametrize(("sync", "aio", "protocol", "async_protocol"), PAIRS)
def test_the_public_methods_the_transports_share_have_the_same_parameters(
    sync: type, aio: type, protocol: type, async_protocol: type
) -> None:
    # Beyond the Protocol: a public method of one that the other also has must not drift.
    sync_methods, aio_methods = _public(sync), _public(aio)
    for name in sorted(set(sync_methods) & set(aio_methods)):
        assert _parameters(sync_methods[name]) == _parameters(aio_methods[name]), name


def test_a_drift_would_be_seen() -> None:
    # The comparison is not vacuous: the sync set's own helper differs from run.
    assert _parameters(ConnectionSet.send_round) != _parameters(ConnectionSet.run)
    assert "run" in _public(ConnectionSet)
    assert "subscriber" in _public(LoopConnections) or "subscriber" in _public(AsyncTransport)


# -- the rules both transports share ---------------------------------------------------------


def test_a_round_is_known_at_a_quorum_at_too_many_noes_or_when_every_node_answered() -> None:
    answer = Round(5, b"OK", 3)
    answer.pending = 5
    for index in range(2):
        answer.record(index, b"OK")
    assert not answer.known()
    answer.record(2, b"OK")
    assert answer.known()  # three yes of five
    refused = Round(5, b"OK", 3)
    refused.pending = 4
    refused.refuse(0, NodeError("down"))
    refused.record(1, 0)
    assert not refused.known()  # two no: a quorum is still possible
    refused.record(2, NodeError("reset"))
    assert refused.known()  # three no: it is not
    every = Round(3, None, 3, give_up=3)  # holder(): every answer wanted, none a yes
    every.pending = 3
    for index in range(3):
        assert not every.known()
        every.record(index, b"someone")
    assert every.known()


def test_a_round_timed_out_marks_only_what_is_still_owed_and_ignores_late_replies() -> None:
    answer = Round(3, b"OK", 2)
    answer.pending = 2
    answer.results[2] = None  # no command for node 2
    answer.record(0, b"OK")
    answer.time_out()
    assert answer.results == [b"OK", TIMED_OUT, None]
    answer.record(1, b"OK")  # late: the round is over
    assert answer.results == [b"OK", TIMED_OUT, None]
    assert answer.yes == 1
    known = Round(3, b"OK", 1)
    known.pending = 3
    known.record(0, b"OK")
    known.time_out()
    assert known.results == [b"OK", PENDING, PENDING]  # not waited for: not timed out


def test_noscript_is_resent_while_the_round_runs_and_only_reloaded_after_unless_when_over():
    noscript = ReplyError("NOSCRIPT No matching script")
    acquire = Fallback(lambda: b"EVAL", when_over=False)
    release = Fallback(lambda: b"EVAL", when_over=True)
    assert on_reply(b"OK", acquire, False) == RECORD
    assert on_reply(ReplyError("ERR other"), acquire, False) == RECORD
    assert on_reply(noscript, None, False) == RECORD  # no fallback: an error like any other
    assert on_reply(noscript, acquire, False) == RESEND
    assert on_reply(noscript, acquire, True) == RELOAD  # a late SET would outlive its release
    assert on_reply(noscript, release, True) == RESEND


def test_the_stall_rule_queues_a_release_behind_a_busy_node_up_to_its_room() -> None:
    rule = StallRule(max_outstanding=4, stall_reset=1.0, stall_age=0.05)
    assert not rule.judged(3, 0.5)  # below the cap: not judged by age
    assert not rule.judged(8, 0.01)  # many, but young: busy, not stalled
    assert rule.judged(8, 0.1)  # many and late: skipped
    assert rule.refusal(8, 0.1) is not None
    assert not rule.judged(8, 0.1, queue_behind=True)  # a release queues behind instead
    assert rule.judged(rule.room_for, 0.1, queue_behind=True)  # past its room it does not
    assert rule.judged(0, 1.5, queue_behind=True)  # past the stall reset: a new connection
    assert rule.reset(1.5)
    assert not rule.reset(0.5)


def test_a_round_that_wants_every_answer_ends_when_every_node_answered(cluster3):
    # holder() asks every node (need = give_up = size) and no reply is a "yes": the round is
    # over once all three answered. The asyncio transport used to wait for the node timeout
    # then, on every holder() and locked() of a held lock; both now share Round.known.
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("every-answer", ttl=60.0)

    async def main() -> dict[str, Any] | None:
        manager = AsyncLockManager(cluster3.urls, node_timeout=20.0)
        try:
            # Bounded far below the node timeout: a round that waits for it fails here.
            return await asyncio.wait_for(manager.holder("every-answer"), 10.0)
        finally:
            await manager.aclose()

    try:
        owner = asyncio.run(main())
        assert owner is not None
        assert owner["nodes"] == 3
        sync_owner = LockManager(cluster3.urls, node_timeout=20.0).holder("every-answer")
        assert sync_owner is not None
        assert {**sync_owner, "ttl": 0} == {**owner, "ttl": 0}  # the same holder, both ways
    finally:
        lease.release()


def test_a_command_larger_than_the_socket_takes_goes_out_whole_and_a_large_reply_comes_in_whole(
    cluster3,
):
    # The common case of a send is inlined in ConnectionSet.send_round: a write the socket
    # takes only in part must still leave its rest buffered and polled for (else the node
    # never gets the end of the command and the round times out), and a reply longer than
    # one read is read to its end.
    import time

    from django_redlock.wire.resp import encode_command

    value = b"v" * (4 << 20)  # far above a unix socket's send buffer
    connections = ConnectionSet(
        LockManager(cluster3.urls).addresses,
        clock=time.monotonic,
        max_outstanding=32,
        stall_reset=20.0,
    )
    try:
        put = (encode_command(b"SET", b"transport:large", value), None)
        done = connections.run([put, None, None], 10.0, b"OK", 1)
        assert done.results[0] == b"OK"
        get = (encode_command(b"GET", b"transport:large"), None)
        assert connections.run([get, None, None], 10.0, value, 1).results[0] == value
        delete = (encode_command(b"DEL", b"transport:large"), None)
        assert connections.run([delete, None, None], 10.0, 1, 1).results[0] == 1
    finally:
        connections.close()
