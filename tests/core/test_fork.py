"""A lease belongs to the process that took it: fork() hands a child a copy of the Lease
object, never the lease (gunicorn --preload, multiprocessing with the fork start method).

Every child here runs on real nodes and leaves with ``os._exit``, so pytest's own teardown
never runs twice; a child that hangs (a lock held across the fork) is killed and fails its
test instead of hanging the suite.
"""

from __future__ import annotations

import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import warnings
from collections.abc import Callable
from contextlib import AbstractContextManager

import pytest

from django_redlock import LeaseInherited, LockContended, LockManager, RedlockError
from django_redlock.core import extender as _extender
from django_redlock.core import turns
from tests.helpers import queued_on_a_majority

CHILD_DEADLINE = 30.0  # seconds; far above what any child needs, only a hang reaches it
HUNG = -1


def fork() -> int:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork with threads (3.12+)
        return os.fork()


def wait_child(pid: int, deadline: float = CHILD_DEADLINE) -> int:
    """The child's exit code, or HUNG (it is killed) if it has not exited by ``deadline``."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return HUNG


def in_child(body: Callable[[], int]) -> int:
    """Run ``body`` in a forked child and return its exit code (``body``'s result; 99 if it
    raised, its traceback on stderr; HUNG if it never returned)."""
    pid = fork()
    if pid == 0:
        code = 99
        try:
            code = body()
        except BaseException:
            traceback.print_exc()
        finally:
            os._exit(code)
    return wait_child(pid)


def in_child_while_held(lock: AbstractContextManager[object], body: Callable[[], int]) -> int:
    """Run ``body`` in a child forked while another thread of this process is inside
    ``lock``, as a parent thread may be at any fork: its exit code (see :func:`in_child`)."""
    inside, leave = threading.Event(), threading.Event()

    def holder() -> None:
        with lock:
            inside.set()
            leave.wait()

    thread = threading.Thread(target=holder)
    thread.start()
    inside.wait()
    try:
        return in_child(body)
    finally:
        leave.set()
        thread.join()


def contended(urls: list[str], name: str) -> bool:
    """A rival's single try on ``name`` finds it held."""
    with LockManager(urls) as rival:
        try:
            rival.acquire(name, ttl=5.0, blocking=False).release()
        except LockContended:
            return True
        return False


def test_a_child_leaving_the_inherited_with_block_leaves_the_parents_lease(cluster3):
    manager = LockManager(cluster3.urls)
    parent = os.getpid()
    try:
        with manager.lock("inherited", ttl=10.0) as lease:
            pid = fork()
            if pid == 0:
                sys.exit(7)  # a worker leaving: unwinds through the with block it inherited
            status = wait_child(pid)
            # The child's exit was its own (the with block did not raise over it) ...
            assert status == 7
            # ... and the lock is still the parent's: no rival gets it, the parent extends it.
            assert contended(cluster3.urls, "inherited")
            assert lease.extend() > 0
    except SystemExit as leaving:
        if os.getpid() != parent:
            os._exit(leaving.code if isinstance(leaving.code, int) else 98)
        raise
    except BaseException:
        if os.getpid() != parent:
            traceback.print_exc()
            os._exit(99)  # the inherited with block raised in the child
        raise
    assert lease.released
    assert not contended(cluster3.urls, "inherited")


def test_release_extend_and_check_refuse_in_a_multiprocessing_child(cluster3):
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("mp", ttl=10.0, auto_extend=True)
    results: multiprocessing.Queue[list[str]] = multiprocessing.get_context("fork").Queue()

    def child() -> None:
        outcomes = []
        for operation in (lease.release, lease.extend, lease.check):
            try:
                operation()
                outcomes.append("done")
            except LeaseInherited as error:
                outcomes.append(f"LeaseInherited from {error.owner_pid}")
            except RedlockError as error:
                outcomes.append(type(error).__name__)
        results.put(outcomes)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        process = multiprocessing.get_context("fork").Process(target=child)
        process.start()
    assert results.get(timeout=CHILD_DEADLINE) == [f"LeaseInherited from {os.getpid()}"] * 3
    process.join(CHILD_DEADLINE)
    assert process.exitcode == 0
    assert contended(cluster3.urls, "mp")
    assert not lease.lost
    assert lease.extend() > 0
    lease.release()


def test_a_child_forked_mid_renewal_refuses_at_once_instead_of_hanging(cluster3):
    # The parent's extender has the lease's turn during each renewal round trip; a fork at
    # that instant gives the child a lease whose turn a thread it does not have took.
    manager = LockManager(cluster3.urls)
    lease = manager.acquire("mid-renewal", ttl=10.0, auto_extend=True)
    assert lease._guard is False  # auto-extended, its turn free
    held, done = threading.Event(), threading.Event()

    def renewing() -> None:
        turns.take(lease)
        try:
            held.set()
            done.wait()
        finally:
            turns.give_back(lease)

    thread = threading.Thread(target=renewing)
    thread.start()
    held.wait()

    def child() -> int:
        try:
            lease.release()
        except LeaseInherited:
            return 0
        return 1

    try:
        status = in_child(child)
    finally:
        done.set()
        thread.join()
    assert status == 0
    assert contended(cluster3.urls, "mid-renewal")
    lease.release()


class Renewals:
    """A LockObserver that sets ``twice`` once two renewals were made."""

    def __init__(self) -> None:
        self.count = 0
        self.twice = threading.Event()

    def acquired(self, lease: object, waited: float) -> None:
        pass

    def released(self, lease: object, held: float) -> None:
        pass

    def extended(self, lease: object, validity: float) -> None:
        self.count += 1
        if self.count >= 2:
            self.twice.set()

    def lost(self, lease: object, reason: str) -> None:
        pass

    def gave_up(self, error: object, waited: float) -> None:
        pass


def test_a_child_gets_its_own_extender_even_if_forked_while_one_was_scheduling(cluster3):
    manager = LockManager(cluster3.urls)
    parents = manager.acquire("parents", ttl=10.0, auto_extend=True)  # the extender runs
    held, done = threading.Event(), threading.Event()

    def scheduling() -> None:  # another thread inside schedule() at the instant of the fork
        with _extender._lock:
            held.set()
            done.wait()

    thread = threading.Thread(target=scheduling)
    thread.start()
    held.wait()

    def child() -> int:
        renewals = Renewals()
        # A generous node timeout: a renewal must not fail because the machine is loaded.
        with LockManager(cluster3.urls, node_timeout=0.5, observer=renewals) as own:
            lease = own.acquire("childs", ttl=3.0, auto_extend=True)
            if not renewals.twice.wait(CHILD_DEADLINE / 2):
                return 1  # no extender renews it
            lease.check()
            if not contended(cluster3.urls, "childs"):
                return 2
            lease.release()
        return 0

    try:
        status = in_child(child)
    finally:
        done.set()
        thread.join()
    assert status == 0
    parents.check()
    parents.release()


def test_a_new_thread_in_the_child_gets_connections_even_if_forked_mid_setup(cluster3):
    manager = LockManager(cluster3.urls)
    manager.acquire("warm", ttl=5.0).release()
    held, done = threading.Event(), threading.Event()

    def opening() -> None:  # another thread registering its connections at the fork
        with manager.engine.connections._lock:
            held.set()
            done.wait()

    thread = threading.Thread(target=opening)
    thread.start()
    held.wait()

    def child() -> int:
        outcome: list[int] = []

        def work() -> None:
            manager.acquire("threaded-child", ttl=5.0).release()
            outcome.append(0)

        worker = threading.Thread(target=work, daemon=True)
        worker.start()
        worker.join(CHILD_DEADLINE / 2)
        return outcome[0] if outcome else 2

    try:
        status = in_child(child)
    finally:
        done.set()
        thread.join()
    assert status == 0


@pytest.mark.parametrize("blocking", [False, True])
def test_parent_and_child_work_side_by_side_on_their_own_sockets(cluster3, blocking):
    # Shared sockets would show at once: one process would read the other's replies (wrong
    # votes, LockLost at release) or steal its wake-ups.
    manager = LockManager(cluster3.urls, retry_delay=0.01)
    lease = manager.acquire("side-by-side", ttl=10.0)
    rounds = 100
    wait = 10.0 if blocking else None

    def child() -> int:
        if contended(cluster3.urls, "side-by-side") is False:
            return 1
        for _ in range(rounds):
            manager.acquire("child-own", ttl=5.0, blocking=blocking, timeout=wait).release()
        return 0

    pid = fork()
    if pid == 0:
        code = 99
        try:
            code = child()
        finally:
            os._exit(code)
    for _ in range(rounds):
        lease.extend()
        manager.acquire("parent-own", ttl=5.0, blocking=blocking, timeout=wait).release()
    assert wait_child(pid) == 0
    lease.release()


def test_lease_inherited_crosses_process_boundaries_intact():
    # A multiprocessing child that raises it sends it back pickled; Celery rebuilds cls(*args).
    error = LeaseInherited("orders:1", 100, 200)
    for copy in (pickle.loads(pickle.dumps(error)), LeaseInherited(*error.args)):  # noqa: S301
        assert type(copy) is LeaseInherited
        assert str(copy) == str(error)
        assert vars(copy) == vars(error)


def listener_of(manager: LockManager) -> str:
    """The listener id of ``manager``'s shared pub/sub sockets (see wake_next.lua)."""
    subscriber = manager.engine.connections._subscriber
    assert subscriber is not None
    return subscriber.listener


def test_a_child_forked_while_threads_wait_hears_its_own_wake_ups(cluster3):
    """The pub/sub sockets are shared by the manager's threads, and one of the waiting threads
    reads them for the others: a child forked then must not inherit that reader (nobody would
    read for it) nor the parent's listener (it would hear the parent's wake-ups), and the
    parent's waiters must still be woken by the release, not by their 10 s poll."""
    slow_poll, prompt = 10.0, 5.0
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("parent-line", ttl=30.0)
    manager = LockManager(cluster3.urls, retry_delay=slow_poll)
    woken: list[float] = []

    def wait() -> None:
        manager.acquire("parent-line", ttl=30.0, timeout=60.0).release()
        woken.append(time.monotonic())

    parents = [threading.Thread(target=wait) for _ in range(4)]
    for thread in parents:
        thread.start()
    deadline = time.monotonic() + prompt
    while not queued_on_a_majority(cluster3, "parent-line", len(parents)):
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.05)  # they subscribe right after their first try, then wait
    listener = listener_of(manager)

    def child() -> int:
        if listener_of(manager) == listener:
            return 1  # it would hear the parent's wake-ups
        with LockManager(cluster3.urls) as rival:
            held = rival.acquire("child-line", ttl=30.0)
            got = threading.Event()

            def child_wait() -> None:
                manager.acquire("child-line", ttl=30.0, timeout=60.0).release()
                got.set()

            waiter = threading.Thread(target=child_wait, daemon=True)
            waiter.start()
            end = time.monotonic() + prompt
            while not queued_on_a_majority(cluster3, "child-line", 1):
                if time.monotonic() > end:
                    return 2
                time.sleep(0.01)
            time.sleep(0.05)  # subscribed and waiting
            held.release()
            return 0 if got.wait(prompt) else 3  # slept through the release: its poll

    status = in_child(child)
    released = time.monotonic()
    lease.release()
    for thread in parents:
        thread.join(slow_poll * 2)
    assert status == 0
    assert len(woken) == len(parents)
    assert max(woken) - released < prompt  # woken by the releases, not by their poll


def test_the_cached_pid_read_on_the_hot_path_is_the_childs():
    """``process.PID`` (what the connection sets and owner scopes compare with the pid they
    recorded) is the child's own pid after a fork, as ``current_pid()`` is: a stale one
    would let a child write to its parent's sockets."""
    from django_redlock.wire import process

    assert os.getpid() == process.PID

    def child() -> int:
        return 0 if process.PID == os.getpid() == process.current_pid() else 1

    assert in_child(child) == 0
