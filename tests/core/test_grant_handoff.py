"""A release hands the lock over: it grants it, on each node, to the live head of the line,
and the waiter holds once a quorum granted it, without a round of its own
(``scripts/hand_grant.lua``; ``procedures/flow.py``: ``Acquire.hear_grants``). Real nodes."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from django_redlock import AsyncLockManager, LockContended, LockManager
from django_redlock.procedures import flow
from django_redlock.wire import scripts
from tests.helpers import lock_token, node_client, node_identity, owner_arg, votes_recorded

KEY = "redlock:handed"
HAND = KEY + "\x00h"


@pytest.fixture
def node(cluster3):
    with node_client(cluster3[0]) as client:
        yield client


def _hand_entries(cluster) -> list[dict[bytes, bytes]]:
    out = []
    for node in cluster:
        with node_client(node) as client:
            out.append(client.hgetall(HAND))
    return out


def _wait_for(condition, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.005)


def _registered(cluster, round_: int) -> bool:
    """Whether one waiter's try of round ``round_`` registered it on every node."""
    return all(
        any(entry.startswith(b"%d " % round_) for entry in entries.values())
        for entries in _hand_entries(cluster)
    )


def _spy_grants(monkeypatch) -> list[flow.Granted | None]:
    """Record what each Acquire.hear_grants returned (a spy on the flow, the nodes real)."""
    seen: list[flow.Granted | None] = []
    real = flow.Acquire.hear_grants

    def spy(self: flow.Acquire, grants: Any, now: float) -> flow.Granted | None:
        held = real(self, grants, now)
        seen.append(held)
        return held

    monkeypatch.setattr(flow.Acquire, "hear_grants", spy)
    return seen


def _holders(cluster, key: str = KEY) -> list[bytes | None]:
    tokens = []
    for node in cluster:
        with node_client(node) as client:
            tokens.append(lock_token(client, key))
    return tokens


def test_a_release_hands_the_lock_to_the_waiter_without_a_round_of_its_own(cluster3, monkeypatch):
    seen = _spy_grants(monkeypatch)
    # A long poll delay: the waiter can only get the lock from the hand-off itself.
    holder, waiter = LockManager(cluster3.urls), LockManager(cluster3.urls, retry_delay=30.0)
    lease = holder.acquire("handed", ttl=10.0)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire("handed", timeout=20.0)))
    thread.start()
    # Its second try (the one right after subscribing) is registered: it now waits.
    _wait_for(lambda: _registered(cluster3, 2))
    rounds_before = list(_hand_entries(cluster3))
    lease.release()
    thread.join(10.0)
    assert got, "the waiter did not get the lock"
    handed = got[0]
    # Held from the grants heard, with no third round: the registrations still name round 2
    # (a grant deletes them), and the lease came from hear_grants.
    assert any(isinstance(held, flow.Granted) for held in seen)
    assert all(len(entries) == 1 for entries in rounds_before)
    # Each node marked its registration granted (hand_undo.lua never deletes a grant).
    assert all(entry.startswith(b"g2 ") for e in _hand_entries(cluster3) for entry in e.values())
    assert _holders(cluster3) == [handed.token.encode()] * 3
    assert 0 < handed.validity <= 30.0  # the waiter's own ttl (the manager's default)
    with pytest.raises(LockContended):
        LockManager(cluster3.urls).acquire("handed", blocking=False)
    handed.release()
    assert _holders(cluster3) == [None, None, None]
    assert _hand_entries(cluster3) == [{}, {}, {}]
    holder.close()
    waiter.close()


def test_the_asyncio_manager_takes_the_hand_off_too(cluster3, monkeypatch):
    seen = _spy_grants(monkeypatch)

    async def main() -> None:
        holder = AsyncLockManager(cluster3.urls)
        waiter = AsyncLockManager(cluster3.urls, retry_delay=30.0)
        lease = await holder.acquire("handed", ttl=10.0)
        task = asyncio.ensure_future(waiter.acquire("handed", timeout=20.0))
        while not _registered(cluster3, 2):
            await asyncio.sleep(0.005)
        await lease.release()
        handed = await asyncio.wait_for(task, 10.0)
        assert any(isinstance(held, flow.Granted) for held in seen)
        assert _holders(cluster3) == [handed.token.encode()] * 3
        await handed.release()
        await holder.aclose()
        await waiter.aclose()

    asyncio.run(main())


def _release_on(node, token: str) -> int:
    """The holder's release reaching this one node only (the others never get it)."""
    with node_client(node) as client:
        return int(client.eval(scripts.RELEASE.source, 1, KEY, token, ""))


def test_a_grant_on_fewer_than_a_quorum_keeps_the_waiters_place_and_node(cluster3):
    holder, waiter = LockManager(cluster3.urls), LockManager(cluster3.urls, retry_delay=0.2)
    lease = holder.acquire("handed", ttl=2.0)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire("handed", timeout=20.0)))
    thread.start()
    _wait_for(lambda: _registered(cluster3, 2))
    assert _release_on(cluster3[0], lease.token) == 1
    # Node 0 now holds the waiter's token: one node is no quorum, so it goes on waiting and
    # keeps that node (its tries answer granted there; nothing releases it).
    tokens = _holders(cluster3)
    assert tokens[0] not in (None, lease.token.encode())
    assert tokens[1:] == [lease.token.encode()] * 2
    with pytest.raises(LockContended):
        LockManager(cluster3.urls).acquire("handed", blocking=False)
    time.sleep(0.5)
    assert _holders(cluster3)[0] == tokens[0]
    # The holder's keys on the other nodes run out: the waiter's tries take them.
    thread.join(10.0)
    assert got, "the waiter did not get the lock"
    assert got[0].token.encode() == tokens[0]
    assert _holders(cluster3) == [tokens[0]] * 3
    got[0].release()
    holder.close()
    waiter.close()


def test_a_waiter_that_gives_up_frees_its_grants(cluster3):
    holder, waiter = LockManager(cluster3.urls), LockManager(cluster3.urls, retry_delay=30.0)
    lease = holder.acquire("handed", ttl=30.0)
    failed: list[BaseException] = []

    def wait() -> None:
        try:
            waiter.acquire("handed", timeout=1.5)
        except LockContended as exc:
            failed.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    _wait_for(lambda: _registered(cluster3, 2))
    assert _release_on(cluster3[0], lease.token) == 1
    granted = _holders(cluster3)[0]
    assert granted not in (None, lease.token.encode())
    thread.join(10.0)
    assert failed, "the waiter should have given up"
    # Its leave freed the grant at once (not in 30 s), and its place.
    _wait_for(lambda: _holders(cluster3)[0] is None, 2.0)
    for node in cluster3:
        with node_client(node) as client:
            assert client.zcard(KEY + scripts.LINE) == 0
            assert client.hlen(HAND) == 0
    lease.release()
    holder.close()
    waiter.close()


def test_a_node_paused_during_the_release_still_leaves_one_holder(cluster3):
    holder, waiter = LockManager(cluster3.urls), LockManager(cluster3.urls, retry_delay=30.0)
    lease = holder.acquire("handed", ttl=10.0)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire("handed", timeout=20.0)))
    thread.start()
    _wait_for(lambda: _registered(cluster3, 2))
    with cluster3[2].paused_while():
        lease.release()  # nodes 0 and 1 grant: a quorum of 3
        thread.join(10.0)
        assert got, "the waiter did not get the lock from two grants"
        handed = got[0]
        assert _holders([cluster3[0], cluster3[1]]) == [handed.token.encode()] * 2
        with pytest.raises(LockContended):
            LockManager(cluster3.urls, node_timeout=0.05).acquire("handed", blocking=False)
    # Node 2 runs the release when it wakes: it grants the same waiter, never another.
    _wait_for(lambda: _holders(cluster3)[2] != lease.token.encode())
    assert _holders(cluster3)[2] in (None, handed.token.encode())
    handed.release()
    _wait_for(lambda: _holders(cluster3) == [None, None, None])
    holder.close()
    waiter.close()


# -- the grant itself, one node, by the scripts ---------------------------------------------


def _register(
    client, waiter: str, token: str, round_: int, lifetime_ms: int = 5_000, ticket: int = 1
) -> Any:
    """A waiter's try (acquire.lua, as a waiter taking grants); the node's run_id given."""
    run_id = node_identity(client)
    keys = (KEY,)  # acquire.lua names the marker, line, lapse and readers keys itself
    args = (token, 7_000, owner_arg(), 60_000, waiter, ticket, lifetime_ms, round_, run_id, "")
    return client.eval(scripts.ACQUIRE.source, len(keys), *keys, *args)


def _hold(client, token: str) -> None:
    client.set(KEY, f"{token} {owner_arg().split(' ', 1)[0]}", px=30_000)


def test_the_grant_writes_the_waiters_token_and_names_its_round(node):
    holder, hand = "a" * 40, "b" * 40
    _hold(node, holder)
    assert _register(node, "lsn.w1", hand, 3) > 0  # refused: the holder's ms left
    pubsub = node.pubsub()
    pubsub.subscribe(KEY + "\x00wlsn")
    pubsub.get_message(timeout=1.0)  # the subscribe confirmation
    assert _release_on_client(node, holder) == 1
    message = pubsub.get_message(timeout=1.0)
    assert message is not None
    assert message["data"] == b"lsn.w1 3"
    assert lock_token(node, KEY) == hand.encode()
    assert 6_000 < node.pttl(KEY) <= 7_000  # the waiter's ttl
    assert node.zcard(KEY + scripts.LINE) == 0  # it left the line: it holds
    pubsub.close()


def _release_on_client(client, token: str) -> int:
    return int(client.eval(scripts.RELEASE.source, 1, KEY, token, ""))


def test_a_restarted_node_grants_nothing_it_only_wakes(node):
    holder, hand = "a" * 40, "b" * 40
    _hold(node, holder)
    _register(node, "lsn.w1", hand, 1)
    # A marker restored from a snapshot names the process that wrote it, not this one.
    node.hset(scripts.NODE_KEY, "run", "f" * 40)
    pubsub = node.pubsub()
    pubsub.subscribe(KEY + "\x00wlsn")
    pubsub.get_message(timeout=1.0)
    assert _release_on_client(node, holder) == 1
    message = pubsub.get_message(timeout=1.0)
    assert message is not None
    assert message["data"] == b"lsn.w1"  # a wake-up: its own try meets the quarantine
    assert node.exists(KEY) == 0
    pubsub.close()


def test_a_waiter_whose_place_lapsed_is_not_granted(node):
    holder, lapsed, live = "a" * 40, "b" * 40, "c" * 40
    _hold(node, holder)
    _register(node, "lsn.w1", lapsed, 1, lifetime_ms=50)  # first in line, then stops
    _register(node, "lsn.w2", live, 1, ticket=2)  # behind it (its place lasts 5 s)
    time.sleep(0.1)
    assert _release_on_client(node, holder) == 1
    assert lock_token(node, KEY) == live.encode()


def test_an_asyncio_waiter_cancelled_after_a_grant_frees_it(cluster3):
    async def main() -> None:
        holder = AsyncLockManager(cluster3.urls)
        waiter = AsyncLockManager(cluster3.urls, retry_delay=30.0)
        lease = await holder.acquire("handed", ttl=30.0)
        task = asyncio.ensure_future(waiter.acquire("handed", timeout=20.0))
        while not _registered(cluster3, 2):
            await asyncio.sleep(0.005)
        assert _release_on(cluster3[0], lease.token) == 1  # one grant: no quorum
        granted = _holders(cluster3)[0]
        assert granted not in (None, lease.token.encode())
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        # The cancelled waiter's leave freed the grant at once (not in 30 s).
        for _ in range(400):
            if _holders(cluster3)[0] is None:
                break
            await asyncio.sleep(0.005)
        assert _holders(cluster3)[0] is None
        await lease.release()
        await holder.aclose()
        await waiter.aclose()

    asyncio.run(main())


def test_a_waiter_that_died_at_the_head_holds_its_grant_only_until_its_ttl(cluster3, tmp_path):
    # A waiter process killed (SIGKILL) while it heads the line: the release grants it the
    # lock (its place has not lapsed yet), and nobody releases that grant. The cost is bounded
    # by the dead waiter's ttl: the next waiter then gets the lock.
    script = tmp_path / "waiter.py"
    script.write_text(
        "import sys\n"
        "from django_redlock import LockManager\n"
        "LockManager(sys.argv[1:], retry_delay=30.0).acquire('handed', ttl=1.5, timeout=60)\n"
    )
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("handed", ttl=30.0)
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": str(root)}  # this checkout's package
    dead = subprocess.Popen([sys.executable, str(script), *cluster3.urls], cwd=root, env=env)
    try:
        _wait_for(lambda: _registered(cluster3, 2), 30.0)
    finally:
        dead.kill()
        dead.wait()
    lease.release()  # granted to the dead waiter on every node
    tokens = _holders(cluster3)
    assert tokens[0] is not None
    assert tokens == [tokens[0]] * 3
    started = time.monotonic()
    with LockManager(cluster3.urls) as late:
        taken = late.acquire("handed", ttl=5.0, timeout=10.0)
        waited = time.monotonic() - started
        assert waited < 5.0  # the dead waiter's 1.5 s ttl, not the holder's 30 s
        # A quorum at least: the dead waiter's grants run out node by node (each from its own
        # node's grant), and a try that finds two of them gone has its quorum there while the
        # third still runs out (CI saw [token, None, token] once, under load).
        held = _holders(cluster3)
        assert held.count(taken.token.encode()) >= 2, held
        assert set(held) <= {taken.token.encode(), None}, held
        taken.release()
    holder.close()


def test_nodes_that_disagree_on_the_head_converge_on_the_oldest_waiter(cluster5):
    # Three waiters' first tries each took a free lock on different nodes before queueing
    # elsewhere: W (oldest ticket) nodes 0-1, Y nodes 2-3, Z node 4. None has a quorum and no
    # release is coming. Their failed rounds yield to an older waiter (hand_yield.lua): W gets
    # every node, Y and Z keep their places behind it.
    tokens = {"lsn.w": "w" * 40, "lsn.y": "y" * 40, "lsn.z": "z" * 40}
    tickets = {"lsn.w": 1, "lsn.y": 2, "lsn.z": 3}
    takes = {"lsn.w": (0, 1), "lsn.y": (2, 3), "lsn.z": (4,)}
    clients = [node_client(node) for node in cluster5]
    try:
        for first, nodes in takes.items():
            for index in nodes:
                assert _try(clients[index], first, tokens[first], tickets[first]) == b"OK"
        for waiter in tokens:
            for index, client in enumerate(clients):
                if index not in takes[waiter]:
                    assert _try(client, waiter, tokens[waiter], tickets[waiter]) != b"OK"
        for waiter in tokens:  # each waiter's failed round: a yield where it took the lock
            for index in takes[waiter]:
                _yield(clients[index], waiter, tokens[waiter], tickets[waiter])
        assert [lock_token(client, KEY) for client in clients] == [b"w" * 40] * 5
        for client in clients:
            assert client.zrange(KEY + scripts.LINE, 0, -1) == [b"lsn.y", b"lsn.z"]
    finally:
        for client in clients:
            client.close()


def _try(client, waiter: str, token: str, ticket: int) -> Any:
    run_id = node_identity(client)
    keys = (KEY,)  # acquire.lua names the marker, line, lapse and readers keys itself
    args = (token, 7_000, owner_arg(), 60_000, waiter, ticket, 5_000, 1, run_id, "")
    return client.eval(scripts.ACQUIRE.source, len(keys), *keys, *args)


def _yield(client, waiter: str, token: str, ticket: int, round_: int = 1) -> Any:
    keys = (KEY, KEY + scripts.LINE, KEY + scripts.LAPSE)
    args = (token, waiter, ticket, 5_000, round_)
    return client.eval(scripts.HAND_YIELD.source, 3, *keys, *args)


def _undo(client, waiter: str, token: str, round_: int) -> Any:
    keys = (KEY, KEY + scripts.LINE, KEY + scripts.LAPSE)
    return client.eval(scripts.HAND_UNDO.source, 3, *keys, token, waiter, round_)


def test_the_undo_of_a_lost_reply_never_deletes_a_grant(node):
    holder, hand = "a" * 40, "b" * 40
    _hold(node, holder)
    _register(node, "lsn.w1", hand, 1)  # its reply lost: the waiter sends an undo behind it
    assert _release_on_client(node, holder) == 1  # ... but a release granted it first
    assert _undo(node, "lsn.w1", hand, 1) == 0
    assert lock_token(node, KEY) == hand.encode()  # the waiter may count this grant


def test_the_undo_deletes_what_the_try_took_and_an_older_try_takes_nothing(node):
    hand = "b" * 40
    # Round 2's try took the free lock; its reply was lost: undone behind it.
    assert _register(node, "lsn.w1", hand, 2) == b"OK"
    assert _undo(node, "lsn.w1", hand, 2) == 1
    assert node.exists(KEY) == 0
    # Round 1's try, queued on a connection replaced while the node stalled, runs after
    # round 2's: it takes nothing (its own undo would find round 2 recorded and keep it).
    assert _register(node, "lsn.w1", hand, 1) == 0
    assert node.exists(KEY) == 0


def test_a_late_yield_never_takes_a_key_a_later_round_found(node):
    # W took the free lock with its first try (the line was empty), and an older waiter O
    # queued behind it. W's round 1 failed elsewhere, so a yield follows on this node... but
    # it sits on a connection replaced while the node stalled, and W's round 2 try, on the
    # new connection, runs first: it meets W's token (answers OK, renewed), and W may count
    # this node for round 2. The yield of round 1 that runs after must leave the key to W.
    mine, older = "w" * 40, "o" * 40
    assert _try(node, "lsn.w", mine, 5) == b"OK"
    assert _try(node, "lsn.o", older, 1) > 0  # queued: the holder's ms left
    assert _register(node, "lsn.w", mine, 2, ticket=5) == b"OK"
    _yield(node, "lsn.w", mine, 5, round_=1)
    assert lock_token(node, KEY) == mine.encode()


def test_late_yields_cannot_make_two_holders(cluster3):
    # The same on three nodes, as the waiters see it. W's first try took nodes 0 and 1 (their
    # lines empty), O's (the older ticket) took node 2, then each queued where the other
    # holds. Round 1 fails for both; W's yields to nodes 0 and 1 are delayed (both nodes
    # stalled, their connections replaced). W's round 2, on the new connections, renews
    # nodes 0 and 1: a quorum, W holds. Were the late yields then to give nodes 0 and 1 to
    # O, the head of their lines, O would hold all three nodes while W holds two.
    mine, older = "w" * 40, "o" * 40
    clients = [node_client(node) for node in cluster3]
    try:
        for index in (0, 1):
            assert _try(clients[index], "lsn.w", mine, 5) == b"OK"
        assert _try(clients[2], "lsn.o", older, 1) == b"OK"
        for index in (0, 1):
            assert _try(clients[index], "lsn.o", older, 1) != b"OK"
        assert _try(clients[2], "lsn.w", mine, 5) != b"OK"
        assert _yield(clients[2], "lsn.o", older, 1) == 1  # O is the oldest: it keeps node 2
        for index in (0, 1):  # W's round 2: both its own keys renewed, a quorum
            assert _register(clients[index], "lsn.w", mine, 2, ticket=5) == b"OK"
        for index in (0, 1):  # round 1's yields, late
            _yield(clients[index], "lsn.w", mine, 5, round_=1)
        holders = [lock_token(client, KEY) for client in clients]
        assert holders == [mine.encode(), mine.encode(), older.encode()]
    finally:
        for client in clients:
            client.close()


GONE = KEY + scripts.GONE  # + a hand-off token: its acquire is over there (hand_gone.lua)


def _leave(client, waiter: str, token: str, gone: bool) -> Any:
    keys = (KEY, KEY + scripts.LINE, KEY + scripts.LAPSE)
    return client.eval(scripts.LEAVE.source, 3, *keys, waiter, token, *(["1"] if gone else []))


def _release_as_waiter(client, token: str, waiter: str) -> int:
    return int(client.eval(scripts.RELEASE.source, 1, KEY, token, waiter))


def _no_trace_of(client, waiter: str) -> bool:
    """Neither a place in line nor a hand-off registration of ``waiter`` on this node."""
    return (
        client.zscore(KEY + scripts.LINE, waiter) is None
        and client.hget(KEY + scripts.LAPSE, waiter) is None
        and client.hget(HAND, waiter) is None
    )


def test_a_late_try_of_a_finished_acquire_is_never_granted_the_lock(node):
    holder, mine, other = "a" * 40, "w" * 40, "y" * 40
    _hold(node, holder)
    # W waits (round 2 registered it), then gives up. Its round 1 try here was not answered
    # (it sits on a connection replaced while the node stalled): its leave marks it gone.
    assert _register(node, "lsn.w", mine, 2, ticket=1) > 0
    assert _register(node, "lsn.y", other, 2, ticket=2) > 0  # Y waits behind it
    assert _leave(node, "lsn.w", mine, gone=True) == 1
    assert 55_000 < node.pttl(GONE + mine) <= 60_000
    # W's round 1 try runs now: refused, and it writes nothing; its undo follows it.
    assert _register(node, "lsn.w", mine, 1, ticket=1) == 0
    assert _no_trace_of(node, "lsn.w")
    assert _undo(node, "lsn.w", mine, 1) == 0
    assert _release_on_client(node, holder) == 1
    assert lock_token(node, KEY) == other.encode()  # the live waiter, not W's phantom


@pytest.mark.parametrize("round_", [1, 3])
def test_a_late_try_after_the_lease_was_released_elsewhere_is_refused(node, round_):
    # W won its lease on the other nodes; here its try has not run yet when its release
    # comes (the release finds no key of its): the release marks it gone, so the try, when it
    # runs, queues no phantom ahead of X's waiter Y (round 1: the fast path's check; round 3:
    # hand_register.lua's).
    holder, mine, other = "x" * 40, "w" * 40, "y" * 40
    assert _release_as_waiter(node, mine, "lsn.w") == 0  # nothing of W's here yet
    assert node.exists(GONE + mine) == 1
    _hold(node, holder)
    assert _register(node, "lsn.y", other, 2, ticket=2) > 0
    assert _register(node, "lsn.w", mine, round_, ticket=1) == 0  # late: refused
    assert _no_trace_of(node, "lsn.w")
    assert _release_on_client(node, holder) == 1
    assert lock_token(node, KEY) == other.encode()


def test_a_leave_that_heard_every_try_leaves_no_mark_and_a_mark_refuses_its_token_only(node):
    # A leave that heard every try (no mark asked) leaves nothing behind; a mark refuses only
    # the tries of its own token: not another waiter's, nor a new acquire that happens to get
    # the waiter id of a finished one (an id's nonce has 32 bits; a token is drawn per acquire).
    holder, mine, other = "a" * 40, "w" * 40, "y" * 40
    _hold(node, holder)
    assert _register(node, "lsn.w", mine, 1, ticket=1) > 0
    assert _leave(node, "lsn.w", mine, gone=False) == 1
    assert node.exists(GONE + mine) == 0
    assert _leave(node, "lsn.v", "v" * 40, gone=True) == 0  # another waiter, gone
    assert _leave(node, "lsn.y", "z" * 40, gone=True) == 0  # a finished acquire with Y's id
    assert _register(node, "lsn.y", other, 1, ticket=2) > 0  # queued: the holder's ms left
    assert node.zscore(KEY + scripts.LINE, "lsn.y") == 2


@pytest.mark.parametrize("registered", [False, True], ids=["try-not-run", "queued"])
@pytest.mark.parametrize("script", ["leave", "release"])
def test_a_node_out_of_memory_still_lets_a_waiter_leave_or_release(node, script, registered):
    # The mark needs memory, and a full node (maxmemory, noeviction) refuses a script's first
    # write that does. So it comes after the writes that need none (the HDELs, even of
    # nothing: a script that wrote may go on writing), and in a pcall besides: the waiter's
    # leave or release is never answered with an error, and its place and registration go.
    holder, mine = "a" * 40, "w" * 40
    _hold(node, holder)
    if registered:
        assert _register(node, "lsn.w", mine, 2, ticket=1) > 0
    node.config_set("maxmemory-policy", "noeviction")
    node.config_set("maxmemory", "1")  # every write that needs memory is refused
    try:
        if script == "leave":
            assert _leave(node, "lsn.w", mine, gone=True) == int(registered)
        else:
            assert _release_as_waiter(node, mine, "lsn.w") == 0  # the holder's, not W's
    finally:
        node.config_set("maxmemory", "0")
    assert _no_trace_of(node, "lsn.w")
    assert lock_token(node, KEY) == holder.encode()


def _send_raw(sock, command: bytes) -> None:
    sock.sendall(command)


def test_a_try_a_paused_node_runs_after_the_leave_queues_no_phantom(cluster3):
    # The late try made real: node 0 is paused (SIGSTOP) while W's leave (on a newer
    # connection) and then W's round 2 try with its undo (on the old one, its bytes held up on
    # the way) reach it; it wakes and runs them in that order. Y waits behind W.
    node = cluster3[0]
    holder, mine, other = "a" * 40, "w" * 40, "y" * 40
    with node_client(node) as client:
        _hold(client, holder)
        assert _register(client, "lsn.w", mine, 2, ticket=1) > 0
        assert _register(client, "lsn.y", other, 2, ticket=2) > 0
        run_id = node_identity(client)
    keys = (KEY, KEY + scripts.LINE, KEY + scripts.LAPSE)
    leave = scripts.LEAVE.eval(keys, ("lsn.w", mine, "1"))
    try_ = scripts.ACQUIRE.eval(
        (KEY,), (mine, 7_000, owner_arg(), 60_000, "lsn.w", 1, 5_000, 2, run_id, "")
    )
    undo = scripts.HAND_UNDO.eval(keys, (mine, "lsn.w", 2))
    newer, older = _raw_connection(node), _raw_connection(node)
    try:
        with node.paused_while():
            _send_raw(newer, leave)
            _send_raw(older, try_ + undo)
        replies = [_read_reply(newer), _read_reply(older), _read_reply(older)]
    finally:
        newer.close()
        older.close()
    assert replies == [b":1", b":0", b":0"]  # left; the late try refused; nothing to undo
    with node_client(node) as client:
        assert _no_trace_of(client, "lsn.w")
        assert _release_on_client(client, holder) == 1
        assert lock_token(client, KEY) == other.encode()


def _raw_connection(node) -> socket.socket:
    """A plain socket to ``node`` (unix or TCP), for bytes sent exactly when the test says."""
    if node.port is None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(10)
        sock.connect(node.socket_path)
        return sock
    return socket.create_connection(("127.0.0.1", node.port), timeout=10)


def _read_reply(sock) -> bytes:
    """One simple RESP reply (an integer or a status), without its line end."""
    data = b""
    while not data.endswith(b"\r\n"):
        chunk = sock.recv(1)
        assert chunk, "the node closed the connection"
        data += chunk
    return data[:-2]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
def test_a_waiter_that_gives_up_marks_itself_gone_where_a_try_was_unanswered(
    cluster3, monkeypatch, asynchronous
):
    # W waits while node 0 is paused (SIGSTOP): its tries there go unanswered (nodes 1 and 2
    # refuse: the holder's). It gives up; its leave marks it gone on node 0, where its tries
    # run late, when the node wakes (hand_gone.lua), and on any node whose reply to some try
    # it did not wait for; nowhere else (a node that answered every try runs none late).
    unanswered: list[set[int]] = []
    real = flow.Acquire.left_line

    def spy(self: flow.Acquire) -> Any:
        unanswered.append(set(self.unanswered))
        return real(self)

    monkeypatch.setattr(flow.Acquire, "left_line", spy)
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("handed", ttl=30.0)
    marks: list[list[bytes]] = []

    def marked() -> bool:
        marks[:] = []
        for node in cluster3:
            with node_client(node) as client:
                marks.append(client.keys(GONE.replace("\x00", "?") + "*"))
        return bool(marks[0])

    if asynchronous:

        async def wait() -> None:
            waiter = AsyncLockManager(cluster3.urls, retry_delay=0.05)
            with cluster3[0].paused_while(), pytest.raises(LockContended):
                await waiter.acquire("handed", timeout=0.3)
            while not marked():  # node 0 runs what it was sent once it wakes
                await asyncio.sleep(0.005)
            await waiter.aclose()

        asyncio.run(wait())
    else:
        waiter = LockManager(cluster3.urls, retry_delay=0.05)
        with cluster3[0].paused_while(), pytest.raises(LockContended):
            waiter.acquire("handed", timeout=0.3)
        _wait_for(marked)  # node 0 runs what it was sent once it wakes
        waiter.close()
    assert len(unanswered) == 1
    assert 0 in unanswered[0]
    assert [index for index, found in enumerate(marks) if found] == sorted(unanswered[0])
    assert all(len(found) <= 1 for found in marks)  # one waiter's mark
    for node in cluster3:
        with node_client(node) as client:
            assert client.zcard(KEY + scripts.LINE) == 0  # no phantom in line
    lease.release()
    holder.close()


def _info_calls(cluster) -> list[int]:
    """How many INFO calls each node ran since its stats were reset (a script's count too)."""
    counts = []
    for node in cluster:
        with node_client(node) as client:
            stats = client.info("commandstats")
            counts.append(int(stats.get("cmdstat_info", {}).get("calls", 0)))
    return counts


def _reset_stats(cluster) -> None:
    for node in cluster:
        with node_client(node) as client:
            client.config_resetstat()


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync", "asyncio"])
def test_a_hand_off_release_names_its_process_so_the_nodes_read_no_info(cluster3, asynchronous):
    # The holder's release carries its connection's identity (Shape.held_release, sent with
    # identify=True), so hand_grant.lua knows the node is the process that recorded the line
    # without an INFO call on each node (scripts/hand_grant.lua).
    waiter = LockManager(cluster3.urls, retry_delay=30.0)
    # Each manager's first grants are recorded on the other nodes, with an INFO call, by a
    # thread of its own (core/witness.py): done before the count.
    waiter.acquire("warm-up", blocking=False).release()
    votes_recorded(waiter)
    got: list[Any] = []

    def wait() -> None:
        got.append(waiter.acquire("handed", timeout=20.0))

    async def hold_and_release(start: threading.Event, registered: threading.Event) -> None:
        holder = AsyncLockManager(cluster3.urls)
        lease = await holder.acquire("handed", ttl=10.0)
        votes_recorded(holder)
        start.set()
        while not registered.is_set():
            await asyncio.sleep(0.005)
        _reset_stats(cluster3)
        await lease.release()
        await holder.aclose()

    start, registered = threading.Event(), threading.Event()
    if asynchronous:
        releaser = threading.Thread(target=lambda: asyncio.run(hold_and_release(start, registered)))
        releaser.start()
        assert start.wait(10.0)
    else:
        holder = LockManager(cluster3.urls)
        lease = holder.acquire("handed", ttl=10.0)
        votes_recorded(holder)
    thread = threading.Thread(target=wait)
    thread.start()
    _wait_for(lambda: _registered(cluster3, 2))
    if asynchronous:
        registered.set()
        releaser.join(10.0)
    else:
        _reset_stats(cluster3)
        lease.release()
        holder.close()
    thread.join(10.0)
    assert got, "the waiter did not get the lock"
    # Granted, every node: the release ran hand_grant.lua there, and read no INFO.
    assert all(entry.startswith(b"g2 ") for e in _hand_entries(cluster3) for entry in e.values())
    assert _info_calls(cluster3) == [0, 0, 0]
    got[0].release()
    waiter.close()
