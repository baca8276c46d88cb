"""Waiting and ownership: prompt fair hand-off, no lost wake-up, re-entry, fork."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
import warnings

import pytest

from django_redlock import LockContended, LockManager
from tests.helpers import lock_token, node_client, queued_on_a_majority

# The poll fallback of these waiters is 10 s (retry_delay): only a release notification can
# wake them within the few seconds the tests allow.
SLOW_POLL = 10.0
PROMPT = 5.0


def line_length(cluster, name: str) -> int:
    with node_client(cluster[0]) as client:
        return int(client.zcard(f"redlock:{name}\x00q"))


def wait_for(condition, timeout: float = PROMPT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition never became true"
        time.sleep(0.002)


def test_a_waiter_is_woken_by_the_release_not_by_its_poll(cluster3):
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("handoff", ttl=30.0)
    waiter = LockManager(cluster3.urls, retry_delay=SLOW_POLL)
    got = threading.Event()

    def wait() -> None:
        waiter.acquire("handoff", ttl=30.0, timeout=60.0).release()
        got.set()

    thread = threading.Thread(target=wait)
    thread.start()
    wait_for(lambda: line_length(cluster3, "handoff") == 1)  # it is waiting in line
    lease.release()
    assert got.wait(PROMPT), "the waiter slept through the release"
    thread.join(PROMPT)


def test_a_release_racing_the_subscribe_is_not_lost(cluster3):
    holder = LockManager(cluster3.urls)
    waiter = LockManager(cluster3.urls, retry_delay=SLOW_POLL)
    for round_ in range(10):
        lease = holder.acquire(f"race{round_}", ttl=30.0)
        got = threading.Event()

        def wait(name: str = f"race{round_}", got: threading.Event = got) -> None:
            waiter.acquire(name, ttl=30.0, timeout=60.0).release()
            got.set()

        thread = threading.Thread(target=wait)
        thread.start()
        # Release the moment the waiter's first try has queued it: it is then subscribing.
        wait_for(lambda name=f"race{round_}": line_length(cluster3, name) == 1)
        lease.release()
        assert got.wait(PROMPT), f"round {round_}: the wake-up was lost"
        thread.join(PROMPT)


def test_a_thread_that_stays_subscribed_is_woken_every_time(cluster3):
    """The second and later waits of a thread skip subscribing (it never unsubscribed) and
    the extra try that follows a new subscription: the release must still reach them."""
    holder = LockManager(cluster3.urls)
    waiter = LockManager(cluster3.urls, retry_delay=SLOW_POLL)
    requests: list[threading.Event] = [threading.Event() for _ in range(10)]
    got: list[threading.Event] = [threading.Event() for _ in range(10)]

    def wait() -> None:  # one thread, the same key, ten waits
        for asked, done in zip(requests, got, strict=True):
            asked.wait(PROMPT)
            waiter.acquire("again", ttl=30.0, timeout=60.0).release()
            done.set()

    thread = threading.Thread(target=wait, daemon=True)
    thread.start()
    for round_, (asked, done) in enumerate(zip(requests, got, strict=True)):
        lease = holder.acquire("again", ttl=30.0)
        asked.set()
        wait_for(lambda: queued_on_a_majority(cluster3, "again", 1))
        lease.release()
        assert done.wait(PROMPT), f"round {round_}: the waiter slept through the release"
    thread.join(PROMPT)


def test_waiters_get_the_lock_in_the_order_they_asked(cluster3):
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("fifo", ttl=30.0)
    order: list[int] = []
    threads = []
    for index in range(3):
        manager = LockManager(cluster3.urls, retry_delay=SLOW_POLL)

        def wait(manager: LockManager = manager, index: int = index) -> None:
            with manager.lock("fifo", ttl=30.0, timeout=60.0):
                order.append(index)

        thread = threading.Thread(target=wait)
        thread.start()
        threads.append(thread)
        wait_for(lambda index=index: line_length(cluster3, "fifo") == index + 1)
    lease.release()
    for thread in threads:
        thread.join(3 * PROMPT)
    assert order == [0, 1, 2]


def test_a_single_try_does_not_jump_the_line(cluster3):
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("line", ttl=30.0)
    waiter = LockManager(cluster3.urls, retry_delay=SLOW_POLL)
    thread = threading.Thread(target=lambda: waiter.acquire("line", timeout=60.0).release())
    thread.start()
    wait_for(lambda: line_length(cluster3, "line") == 1)
    lease.release()
    thread.join(PROMPT)
    assert not thread.is_alive()


def test_reentry_in_one_thread_shares_the_lease_and_counts(cluster3):
    manager = LockManager(cluster3.urls)
    with manager.lock("nested", ttl=10.0) as outer:
        with manager.lock("nested", ttl=10.0) as inner:
            assert inner is outer
            assert outer.depth == 2
        assert outer.depth == 1
        assert not outer.released
        with node_client(cluster3[0]) as client:
            assert lock_token(client, outer.key) == outer.token.encode()
        # Another thread is never the owner.
        errors: list[BaseException] = []

        def other() -> None:
            try:
                manager.acquire("nested", blocking=False)
            except LockContended as error:
                errors.append(error)

        thread = threading.Thread(target=other)
        thread.start()
        thread.join(PROMPT)
        assert len(errors) == 1
    assert outer.released


def test_reentry_is_per_asyncio_task(cluster3):
    manager = LockManager(cluster3.urls)

    async def main() -> None:
        lease = manager.acquire("per-task", ttl=10.0)
        assert manager.acquire("per-task", ttl=10.0) is lease  # same task: re-entry
        lease.release()

        async def other_task() -> str:
            try:
                manager.acquire("per-task", blocking=False)
            except LockContended:
                return "contended"
            return "acquired"

        assert await asyncio.create_task(other_task()) == "contended"
        lease.release()

    asyncio.run(main())


def test_a_forked_child_owns_nothing_of_the_parents(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("forked", ttl=10.0, auto_extend=True)
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: report, then leave at once without running pytest's teardown
        code = 0
        try:
            try:
                manager.acquire("forked", blocking=False)
                code = 1  # it re-entered the parent's lease: wrong
            except LockContended:
                pass
            manager.acquire("child-only", ttl=5.0).release()  # its own sockets work
        except BaseException:
            code = 2
        os.write(write, bytes([code]))
        os._exit(0)
    os.close(write)
    status = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    assert status == b"\x00"
    # The parent's lease and connections are untouched by the child.
    assert lease.extend() > 0
    lease.release()


class Interrupted(Exception):
    """What the test's signal handler raises in the waiting thread."""


def _raise_interrupted(signum, frame):
    raise Interrupted


def test_a_waiter_interrupted_between_tries_leaves_the_line_at_once(cluster3):
    # A signal handler that raises (a Celery soft time limit, a KeyboardInterrupt) while the
    # waiter sleeps between tries: its place must go at once, as when it gives up, or the
    # next release wakes nobody and a single try is refused until the place lapses (40 s).
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("interrupted", ttl=30.0)
    waiter = LockManager(cluster3.urls, retry_delay=SLOW_POLL)
    main = threading.get_ident()

    def interrupt_once_queued() -> None:
        wait_for(lambda: line_length(cluster3, "interrupted") == 1)
        time.sleep(0.05)  # past the try: into the wait
        signal.pthread_kill(main, signal.SIGUSR1)

    previous = signal.signal(signal.SIGUSR1, _raise_interrupted)
    thread = threading.Thread(target=interrupt_once_queued)
    try:
        thread.start()
        with pytest.raises(Interrupted):
            waiter.acquire("interrupted", ttl=30.0, timeout=60.0)
    finally:
        thread.join(PROMPT)
        signal.signal(signal.SIGUSR1, previous)
    for node in cluster3:
        with node_client(node) as client:
            assert client.zcard("redlock:interrupted\x00q") == 0
    lease.release()
    LockManager(cluster3.urls).acquire("interrupted", ttl=30.0, blocking=False).release()


def clients_per_node(cluster) -> list[tuple[set[int], set[int]]]:
    """Per node: the ids of the clients connected (the asking one left out), and the ids of
    those that are pub/sub ones. Ids, not counts: a connection another test left closing may
    go between two samples, and a count would take that for one of ours."""
    clients = []
    for node in cluster:
        with node_client(node) as client:
            rows = client.client_list()
            asking = client.client_id()
        ids = {int(row["id"]) for row in rows if int(row["id"]) != asking}
        pubsub = {int(row["id"]) for row in rows if "P" in row.get("flags", "")}
        clients.append((ids, pubsub - {asking}))
    return clients


def clients_since(cluster, before) -> list[tuple[set[int], set[int]]]:
    """Per node: the clients (all, and pub/sub) connected now that were not in ``before``."""
    return [
        (ids - old_ids, pubsub - old_pubsub)
        for (ids, pubsub), (old_ids, old_pubsub) in zip(
            clients_per_node(cluster), before, strict=True
        )
    ]


def test_threads_waiting_in_one_line_share_one_pubsub_connection_per_node(cluster3):
    """Waiting adds no connection per thread (issue 28): while 32 threads of one process wait
    in one line on 3 nodes, the process holds at most threads + 1 sockets per node (one
    command connection per thread, one pub/sub connection), not two per thread; then each
    gets the lock once, in turn."""
    threads = 32
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("crowd", ttl=60.0)
    before = clients_per_node(cluster3)  # the holder's and any other test's connections
    waiters = LockManager(cluster3.urls, retry_delay=SLOW_POLL)
    got: list[int] = []
    done = threading.Lock()

    def wait(index: int) -> None:
        waiters.acquire("crowd", ttl=60.0, timeout=60.0).release()
        with done:
            got.append(index)

    crowd = [threading.Thread(target=wait, args=(index,)) for index in range(threads)]
    for thread in crowd:
        thread.start()
    try:
        wait_for(lambda: queued_on_a_majority(cluster3, "crowd", threads))
        # Every thread is in line; each subscribes right after its first try. Sampled a few
        # times while they wait: the largest count seen is checked.
        wait_for(lambda: all(pubsub for _, pubsub in clients_since(cluster3, before)))
        peak = [0] * len(before)
        for _ in range(10):
            for index, (ids, _) in enumerate(clients_since(cluster3, before)):
                peak[index] = max(peak[index], len(ids))
            time.sleep(0.02)
        pubsub = [len(new) for _, new in clients_since(cluster3, before)]
        open_now = waiters.open_connections()
    finally:
        lease.release()
        for thread in crowd:
            thread.join(PROMPT * 4)
    assert all(count <= threads + 1 for count in peak), peak
    assert pubsub == [1, 1, 1]
    assert open_now <= len(cluster3.urls) * (threads + 1)
    assert sorted(got) == list(range(threads))  # every waiter got the lock once
    waiters.close()
    holder.close()
