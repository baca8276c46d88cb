"""Semaphores, read-write locks and several locks at once, through the managers, on real
nodes: the same quorum, validity, retry, wake-up and clean-up rules as a lock, with faults
(a paused minority, nodes whose states differ, a holder that never releases).
"""

from __future__ import annotations

import asyncio
import itertools
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest

from django_redlock import AsyncLockManager, LockContended, LockLost, LockManager
from django_redlock.procedures.shapes import Slots
from django_redlock.wire import primitives
from tests.helpers import lock_token, node_client, put_lock

SLOW_POLL = 10.0  # a waiter's poll: only a wake-up brings it the lease within PROMPT
PROMPT = 5.0


def wait_for(condition: Callable[[], bool], timeout: float = PROMPT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.002)


def held_on(cluster, *keys: str) -> int:
    """How many of ``keys`` exist, summed over every node."""
    total = 0
    for node in cluster:
        with node_client(node) as client:
            total += int(client.exists(*keys))
    return total


def slot_holders(cluster, name: str, limit: int) -> list[dict[int, bytes]]:
    """Per node: slot -> the token holding it."""
    found = []
    for node in cluster:
        with node_client(node) as client:
            found.append(
                {
                    slot: held
                    for slot in range(limit)
                    if (held := lock_token(client, primitives.slot_key(f"redlock:{name}", slot)))
                }
            )
    return found


# -- semaphore ---------------------------------------------------------------------------


def test_a_semaphore_grants_at_most_limit_leases_across_managers(cluster3):
    managers = [LockManager(cluster3.urls) for _ in range(3)]
    leases = [m.semaphore("api", 2).acquire(ttl=10.0, blocking=False) for m in managers[:2]]
    assert {lease.slot for lease in leases} == {0, 1}
    with pytest.raises(LockContended) as refused:
        managers[2].semaphore("api", 2).acquire(ttl=10.0, blocking=False)
    assert refused.value.retry_after is not None
    assert 0 < refused.value.retry_after <= 10.0
    # The refused try left nothing behind on any node (a lease's grant to the one node it
    # did not wait for may still be on its way, or lost to the refused try and cleaned up).
    tokens = {lease.token.encode() for lease in leases}
    wait_for(lambda: all(set(held.values()) <= tokens for held in slot_holders(cluster3, "api", 2)))
    leases[0].release()
    third = managers[2].semaphore("api", 2).acquire(ttl=10.0, blocking=False)
    assert third.owned()
    assert leases[1].owned()
    assert third.extend() > 9.0
    third.release()
    leases[1].release()
    assert slot_holders(cluster3, "api", 2) == [{}, {}, {}]


def test_concurrent_holders_never_exceed_the_limit(cluster5):
    limit, workers, rounds = 2, 6, 8
    inside = 0
    most = 0
    guard = threading.Lock()
    errors: list[BaseException] = []

    def work() -> None:
        nonlocal inside, most
        manager = LockManager(cluster5.urls, retry_delay=0.01)
        try:
            for _ in range(rounds):
                with manager.semaphore("pool", limit).acquire(ttl=10.0, timeout=30.0):
                    with guard:
                        inside += 1
                        most = max(most, inside)
                    time.sleep(0.002)
                    with guard:
                        inside -= 1
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=work) for _ in range(workers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert errors == []
    assert most == limit  # reached, never exceeded
    assert slot_holders(cluster5, "pool", limit) == [{}] * 5


def test_a_semaphore_works_with_a_paused_minority(cluster3):
    manager = LockManager(cluster3.urls, node_timeout=0.05)
    with cluster3[2].paused_while():
        first = manager.semaphore("api", 1).acquire(ttl=10.0, blocking=False)
        with pytest.raises(LockContended):
            LockManager(cluster3.urls).semaphore("api", 1).acquire(ttl=10.0, blocking=False)
        assert first.extend() > 9.0
        first.release()
        again = manager.semaphore("api", 1).acquire(ttl=10.0, blocking=False)
        again.release()


def test_nodes_that_granted_another_slot_are_freed(cluster3):
    """Node 0 holds slot 0 for a lease the others never saw: it grants slot 1 while the
    others grant slot 0. Only the quorum's slot is held; node 0's stray grant is freed."""
    with node_client(cluster3[0]) as client:
        put_lock(client, primitives.slot_key("redlock:api", 0), "x" * 40)
        client.pexpire(primitives.slot_key("redlock:api", 0), 30_000)
    manager = LockManager(cluster3.urls)
    lease = manager.semaphore("api", 2).acquire(ttl=10.0, blocking=False)
    assert lease.slot == 0
    token = lease.token.encode()
    held = slot_holders(cluster3, "api", 2)
    assert [slots.get(0) for slots in held[1:]] == [token, token]
    assert held[0].get(0) == b"x" * 40
    # Node 0's grant of slot 1 is freed at once when its reply came within the round, else
    # (the round was decided without it) by the release, which frees whatever slot the
    # token holds on a node.
    assert lease.owned()
    lease.release()
    for slots in slot_holders(cluster3, "api", 2):
        assert token not in slots.values()


def test_a_won_semaphore_round_frees_the_other_slots_it_heard_of():
    """The steps without I/O: which nodes get a release after a won round, how the round is
    decided, and which slot the next try prefers."""
    shape = Slots("redlock:api", 3, 5)
    decider = shape.decider(3)
    replies = [[1, 1], [1, 0], [0, 5], [1, 0], [1, 0]]
    decided = [reply == decider for reply in replies]
    assert decided == [False, False, False, False, True]  # slot 0 reached 3 at the fifth
    assert shape.votes(replies, 1) == 3
    assert shape.slot == shape.prefer == 0
    strays = shape.won("t" * 40, replies)
    assert strays is not None
    assert [command is not None for command in strays] == [True, False, False, False, False]
    # No slot can reach a quorum any more: decided early, a hung minority is not waited for.
    early = shape.decider(3)
    assert [reply == early for reply in ([1, 0], [0, 5], [1, 1], [0, 5])] == [
        False,
        False,
        False,
        True,
    ]


def semaphore_waiter(cluster) -> tuple[threading.Thread, threading.Event]:
    """A thread waiting for the semaphore "api" of 1 slot (polling only every SLOW_POLL: a
    wake-up brings it the lease within PROMPT), then releasing it; the event is set then."""
    waiter = LockManager(cluster.urls, retry_delay=SLOW_POLL)
    got = threading.Event()

    def wait() -> None:
        waiter.semaphore("api", 1).acquire(ttl=30.0, timeout=60.0).release()
        got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    return thread, got


def test_a_waiter_is_woken_by_a_released_slot(cluster3):
    holder = LockManager(cluster3.urls).semaphore("api", 1).acquire(ttl=30.0)
    thread, got = semaphore_waiter(cluster3)
    base = primitives.semaphore_base("redlock:api")

    def queued() -> bool:
        with node_client(cluster3[0]) as client:
            return bool(client.zcard(base + "\x00q"))

    wait_for(queued)
    holder.release()
    assert got.wait(PROMPT), "the waiter slept through the release"
    thread.join(PROMPT)


def test_a_waiter_granted_by_a_minority_keeps_its_place_there(cluster3):
    """A waiter whose tries only node 2 grants (the one slot is another's on nodes 0 and 1)
    frees node 2's slot after each failed round and keeps its place in line there, under the
    ticket it has on the nodes that refused it: one order on every node, so each release wakes
    the same waiter everywhere (scripts/semaphore_release.lua). It does not wake itself: once
    subscribed, it waits. When nodes 0 and 1 free the slot, it gets the lease."""
    key = primitives.slot_key("redlock:api", 0)
    other = "f" * 40
    for node in cluster3.nodes[:2]:
        with node_client(node) as client:
            put_lock(client, key, other)
            client.pexpire(key, 60_000)
    thread, got = semaphore_waiter(cluster3)
    line = primitives.semaphore_base("redlock:api") + "\x00q"

    def places() -> list[list[tuple[bytes, float]]]:
        found = []
        for node in cluster3:
            with node_client(node) as client:
                found.append(client.zrange(line, 0, -1, withscores=True))
        return found

    def tries_on_node_2() -> int:
        with node_client(cluster3[2]) as client:
            return int(client.info("commandstats").get("cmdstat_evalsha", {}).get("calls", 0))

    try:
        wait_for(lambda: len(set(map(tuple, places()))) == 1 and len(places()[0]) == 1)
        (((member, ticket),),) = {tuple(p) for p in places()}
        with node_client(cluster3[2]) as client:
            assert lock_token(client, key) is None  # its grant there was freed
        # Waiting now (a try per SLOW_POLL at most): no wake-up of its own sends it again.
        wait_for(lambda: not waiter_busy(tries_on_node_2))
        assert places() == [[(member, ticket)]] * 3
    finally:
        for node in cluster3.nodes[:2]:  # the other holder releases: the waiter is woken
            with node_client(node) as client:
                client.eval(
                    primitives.SEMAPHORE_RELEASE.source,
                    3,
                    line,
                    primitives.semaphore_base("redlock:api") + "\x00e",
                    key,
                    other,
                    "",
                )
        assert got.wait(PROMPT), "the waiter slept through the release"
        thread.join(PROMPT)


def waiter_busy(tries: Callable[[], int]) -> bool:
    """Whether a node's script calls still climb: counted twice, 0.2 s apart."""
    before = tries()
    time.sleep(0.2)
    return tries() != before


def test_a_slot_never_released_runs_out_within_its_ttl(cluster3):
    manager = LockManager(cluster3.urls)
    manager.semaphore("api", 1).acquire(ttl=0.3)  # dropped: its holder "died"
    wait_for(lambda: slot_holders(cluster3, "api", 1) == [{}, {}, {}])
    manager.semaphore("api", 1).acquire(ttl=5.0, blocking=False).release()


def test_semaphore_arguments_and_limits(cluster3):
    manager = LockManager(cluster3.urls)
    with pytest.raises(TypeError, match="limit"):
        manager.semaphore("api", "3")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="limit"):
        manager.semaphore("api", 0)
    with pytest.raises(ValueError, match="name"):
        manager.semaphore("", 2)
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        manager.semaphore("api", 2).acquire(colour="red")  # type: ignore[call-arg]
    lease = manager.semaphore("api", 2).acquire(blocking=False)
    with pytest.raises(TypeError, match="only a lock's"):
        lease.handle()
    assert lease.depth == 1
    assert not lease.released
    # Not re-entrant: the same thread takes a second slot, a lease of its own.
    second = manager.semaphore("api", 2).acquire(blocking=False)
    assert second is not lease
    assert {lease.slot, second.slot} == {0, 1}
    lease.release()
    second.release()


def test_a_lost_slot_is_reported_at_release(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.semaphore("api", 1).acquire(ttl=10.0)
    for node in cluster3:
        with node_client(node) as client:
            client.delete(primitives.slot_key("redlock:api", 0))  # an operator's flush
    assert not lease.owned()
    with pytest.raises(LockLost):
        lease.extend()
    with pytest.raises(LockLost):
        lease.release()


def test_a_semaphore_lease_is_auto_extended(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.semaphore("api", 1).acquire(ttl=0.6, auto_extend=True)
    wait_for(lambda: lease.acquired_at + 1.2 < manager.engine.clock())  # two ttls later
    assert lease.owned()
    assert not lease.lost
    lease.release()


# -- read-write lock ---------------------------------------------------------------------


def test_readers_share_and_exclude_a_writer_and_the_lock(cluster3):
    one, two = LockManager(cluster3.urls), LockManager(cluster3.urls)
    r1 = one.rwlock("table").read(ttl=10.0, blocking=False)
    r2 = two.rwlock("table").read(ttl=10.0, blocking=False)
    with pytest.raises(LockContended):
        two.rwlock("table").write(ttl=10.0, blocking=False)
    with pytest.raises(LockContended):  # the lock of the same name is the write lease
        two.acquire("table", ttl=10.0, blocking=False)
    assert r1.owned()
    assert r2.extend() > 9.0
    r1.release()
    r2.release()
    writer = two.rwlock("table").write(ttl=10.0, blocking=False)
    with pytest.raises(LockContended):
        one.rwlock("table").read(ttl=10.0, blocking=False)
    writer.release()
    lock = one.acquire("table", ttl=10.0, blocking=False)
    with pytest.raises(LockContended):
        two.rwlock("table").read(ttl=10.0, blocking=False)
    lock.release()


def test_live_readers_hold_back_a_multi_lock_of_their_name(cluster3):
    # lock_many takes the very locks of its names, and a lock is the write lease of the
    # read-write lock of its name: a multi-lock granted beside a live reader would be two
    # holders, one of them exclusive (found by an adversarial test; the script read no readers).
    one, two = LockManager(cluster3.urls), LockManager(cluster3.urls)
    reader = one.rwlock("acct").read(ttl=10.0, blocking=False)
    with pytest.raises(LockContended) as refused:
        two.lock_many(["acct", "other"], ttl=10.0, blocking=False)
    assert refused.value.retry_after is not None
    assert refused.value.retry_after > 5.0  # the reader's time left, not a blind poll
    assert reader.owned()
    # All or nothing: not even the free name stays taken. (A node the reader's grant had not
    # reached yet may have granted the try; its clean-up frees it, so wait for every node.)
    wait_for(lambda: held_on(cluster3, "redlock:acct", "redlock:other") == 0)
    reader.release()
    many = two.lock_many(["acct", "other"], ttl=10.0, blocking=False)
    with pytest.raises(LockContended):  # and the other way round, as before
        one.rwlock("acct").read(ttl=10.0, blocking=False)
    many.release()


def test_a_reader_that_ran_out_does_not_hold_back_a_multi_lock(cluster3):
    manager = LockManager(cluster3.urls)
    manager.rwlock("acct").read(ttl=0.3, blocking=False)  # dropped: it runs out

    def free() -> bool:
        for node in cluster3:
            with node_client(node) as client:
                last = client.zrange("redlock:acct\x00r", -1, -1, withscores=True)
                seconds, micros = client.time()
                if last and last[0][1] > seconds * 1000 + micros // 1000:
                    return False
        return True

    wait_for(free)
    manager.lock_many(["acct", "other"], ttl=10.0, blocking=False).release()


def test_a_waiting_writer_holds_back_new_readers_and_gets_the_lock(cluster3):
    readers = LockManager(cluster3.urls)
    first = readers.rwlock("table").read(ttl=30.0)
    writer = LockManager(cluster3.urls, retry_delay=SLOW_POLL)
    got = threading.Event()

    def write() -> None:
        writer.rwlock("table").write(ttl=30.0, timeout=60.0).release()
        got.set()

    thread = threading.Thread(target=write)
    thread.start()

    def writer_queued() -> bool:
        with node_client(cluster3[0]) as client:
            return any(m.startswith(b"w|") for m in client.zrange("redlock:table\x00q", 0, -1))

    wait_for(writer_queued)
    with pytest.raises(LockContended):  # the writer's intent holds back a new reader
        readers.rwlock("table").read(ttl=30.0, blocking=False)
    first.release()
    assert got.wait(PROMPT), "the writer slept through the last reader's release"
    thread.join(PROMPT)
    readers.rwlock("table").read(ttl=30.0, blocking=False).release()


def test_a_read_lease_survives_a_paused_minority(cluster5):
    manager = LockManager(cluster5.urls, node_timeout=0.05)
    with cluster5[0].paused_while(), cluster5[1].paused_while():
        lease = manager.rwlock("table").read(ttl=10.0, blocking=False)
        with pytest.raises(LockContended):
            LockManager(cluster5.urls).rwlock("table").write(ttl=10.0, blocking=False)
        lease.release()


# -- several locks at once ---------------------------------------------------------------


def test_lock_many_is_all_or_nothing(cluster3):
    one, two = LockManager(cluster3.urls), LockManager(cluster3.urls)
    b = two.acquire("b", ttl=10.0)
    with pytest.raises(LockContended):
        one.lock_many(["a", "b", "c"], ttl=10.0, blocking=False)
    # The refused try keeps nothing (the clean-up frees a node that granted it before b's
    # grant reached it: wait for every node).
    wait_for(lambda: held_on(cluster3, "redlock:a", "redlock:c") == 0)
    b.release()
    lease = one.lock_many(["c", "a", "b", "a"], ttl=10.0, blocking=False)
    assert lease.names == ("a", "b", "c")
    assert lease.name == "a + b + c"
    with pytest.raises(LockContended):
        two.acquire("c", ttl=10.0, blocking=False)
    assert lease.owned()
    assert lease.extend() > 9.0
    lease.release()

    # The release returns at a quorum of answers; the third node's may still be on its way
    # (seen on Redis 7 under load), so wait for every node rather than read it at once.
    wait_for(lambda: held_on(cluster3, "redlock:a", "redlock:b", "redlock:c") == 0)
    two.acquire("c", ttl=10.0, blocking=False).release()


def test_a_blocking_lock_many_waits_without_holding_anything(cluster3):
    holder = LockManager(cluster3.urls)
    b = holder.acquire("b", ttl=30.0)
    taker = LockManager(cluster3.urls, retry_delay=0.02)
    got: list[object] = []
    thread = threading.Thread(
        target=lambda: got.append(taker.lock_many(["a", "b"], ttl=30.0, timeout=30.0))
    )
    thread.start()
    time.sleep(0.1)
    # While it waits, "a" is free for anyone: nothing is held while waiting (no deadlock).
    holder.acquire("a", ttl=30.0, blocking=False).release()
    b.release()
    thread.join(PROMPT)
    assert len(got) == 1
    got[0].release()  # type: ignore[attr-defined]


def test_lock_many_arguments(cluster3):
    manager = LockManager(cluster3.urls)
    with pytest.raises(TypeError, match="single str"):
        manager.lock_many("ab")
    with pytest.raises(ValueError, match="at least one"):
        manager.lock_many([])
    with pytest.raises(ValueError, match=r"names\[1\]: name must not be empty"):
        manager.lock_many(["a", ""])
    with pytest.raises(TypeError, match="names must be an iterable of str, not NoneType"):
        manager.lock_many(None)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"names\[1\]: name must be a str, not int"):
        manager.lock_many(["a", 5])  # type: ignore[list-item]
    with pytest.raises(ValueError, match=r"names\[0\]: name must be valid Unicode"):
        manager.lock_many(["a\udc80"])
    with pytest.raises(ValueError, match="at most 1024"):  # refused before it fills the memory
        manager.lock_many(f"n{i}" for i in itertools.count())
    with pytest.raises(ZeroDivisionError):  # the iterable's own error, not hidden by ours
        manager.lock_many(f"n{1 // i}" for i in range(2))

    async def main() -> None:
        with pytest.raises(TypeError, match="names must be an iterable of str, not int"):
            await AsyncLockManager(cluster3.urls).lock_many(5)  # type: ignore[arg-type]

    asyncio.run(main())


def test_a_dropped_multi_lock_runs_out_within_its_ttl(cluster3):
    manager = LockManager(cluster3.urls)
    manager.lock_many(["a", "b"], ttl=0.3)

    # Every node, not just one: each node's copy expires ttl after that node applied the SET,
    # and the nodes applied it at slightly different moments (a loaded machine: milliseconds).
    def free() -> bool:
        for node in cluster3:
            with node_client(node) as client:
                if int(client.exists("redlock:a", "redlock:b")) != 0:
                    return False
        return True

    wait_for(free)
    manager.lock_many(["a", "b"], ttl=5.0, blocking=False).release()


# -- asyncio -----------------------------------------------------------------------------


def test_the_asyncio_manager_has_the_same_kinds(cluster3):
    async def main() -> None:
        manager = AsyncLockManager(cluster3.urls)
        other = AsyncLockManager(cluster3.urls)
        s1 = await manager.semaphore("api", 2).acquire(ttl=10.0, blocking=False)
        s2 = await other.semaphore("api", 2).acquire(ttl=10.0, blocking=False)
        with pytest.raises(LockContended):
            await other.semaphore("api", 2).acquire(ttl=10.0, blocking=False)
        assert await s1.owned()
        assert await s2.extend() > 9.0
        await s1.release()
        async with await other.semaphore("api", 2).acquire(ttl=10.0, blocking=False):
            pass
        await s2.release()
        async with (
            await manager.rwlock("t").read(ttl=10.0, blocking=False),
            await other.rwlock("t").read(ttl=10.0, blocking=False),
        ):
            with pytest.raises(LockContended):
                await other.rwlock("t").write(ttl=10.0, blocking=False)
        writer = await other.rwlock("t").write(ttl=10.0, blocking=False)
        await writer.release()
        many = await manager.lock_many(["a", "b"], ttl=10.0, blocking=False)
        with pytest.raises(LockContended):
            await other.acquire("b", ttl=10.0, blocking=False)
        assert await many.owned()
        await many.release()
        await manager.aclose()
        await other.aclose()

    asyncio.run(main())
    assert slot_holders(cluster3, "api", 2) == [{}, {}, {}]


def test_asyncio_readers_hold_back_a_multi_lock_of_their_name(cluster3):
    async def main() -> None:
        one, two = AsyncLockManager(cluster3.urls), AsyncLockManager(cluster3.urls)
        reader = await one.rwlock("acct").read(ttl=10.0, blocking=False)
        with pytest.raises(LockContended):
            await two.lock_many(["acct", "other"], ttl=10.0, blocking=False)
        assert await reader.owned()
        await reader.release()
        await (await two.lock_many(["acct", "other"], ttl=10.0, blocking=False)).release()

    asyncio.run(main())


def test_an_asyncio_semaphore_waiter_is_woken(cluster3):
    async def main() -> None:
        holder = AsyncLockManager(cluster3.urls)
        waiter = AsyncLockManager(cluster3.urls, retry_delay=SLOW_POLL)
        held = await holder.semaphore("api", 1).acquire(ttl=30.0)
        task = asyncio.create_task(waiter.semaphore("api", 1).acquire(ttl=30.0, timeout=60.0))
        await asyncio.sleep(0.2)
        await held.release()
        got = await asyncio.wait_for(task, PROMPT)
        await got.release()

    asyncio.run(main())


def test_a_killed_holders_slot_runs_out_within_its_ttl(cluster3):
    """A process SIGKILLed while it holds an auto-extended slot: renewal dies with it, so the
    slot frees within its ttl, never by hand."""
    script = (
        "import sys, time\n"
        "from django_redlock import LockManager\n"
        "m = LockManager(sys.argv[1:])\n"
        "lease = m.semaphore('api', 1).acquire(ttl=0.6, auto_extend=True)\n"
        "print('held', flush=True)\n"
        "time.sleep(60)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", script, *cluster3.urls], stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "held"
        manager = LockManager(cluster3.urls)
        with pytest.raises(LockContended):
            manager.semaphore("api", 1).acquire(blocking=False)
        holder.send_signal(signal.SIGKILL)
        holder.wait(PROMPT)
        got = manager.semaphore("api", 1).acquire(ttl=5.0, timeout=PROMPT)
        got.release()
    finally:
        holder.kill()
        holder.wait(PROMPT)
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_refused_semaphore_try_frees_its_grant_without_another_call(cluster3):
    # A clean-up is sent without waiting for its reply, and this manager is never used
    # again: if the node lacks the release script, nobody would read its NOSCRIPT and send
    # the EVAL, and the grant would stay until it runs out (seen as a flaky test). Scripts
    # not loaded on every new connection therefore go as EVAL in a clean-up.
    for node in cluster3.nodes[:2]:  # slot 0 of a semaphore of 1 held by another there
        with node_client(node) as client:
            put_lock(client, primitives.slot_key("redlock:clean", 0), "f" * 40)
            client.pexpire(primitives.slot_key("redlock:clean", 0), 60_000)
    with node_client(cluster3[2]) as client:
        client.script_flush()
        client.script_load(primitives.SEMAPHORE_ACQUIRE.source)  # it grants at once; no release
    manager = LockManager(cluster3.urls)
    with pytest.raises(LockContended):
        manager.semaphore("clean", 1).acquire(ttl=60.0, blocking=False)

    def freed() -> bool:
        with node_client(cluster3[2]) as client:
            return int(client.exists(primitives.slot_key("redlock:clean", 0))) == 0

    wait_for(freed)
