"""Adversarial checks of the one-message hand-off (``scripts/hand_grant.lua``,
``procedures/flow.py``: ``Acquire.hear_grants``) on real nodes: paused waiters, paused nodes,
many waiters at once, sync and asyncio."""

from __future__ import annotations

import asyncio
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from django_redlock import AsyncLockManager, LockManager
from django_redlock.procedures import flow
from tests.helpers import lock_token, node_client

KEY = "redlock:handed"
ROOT = Path(__file__).resolve().parents[2]

WAITER = {
    "sync": (
        "import sys\n"
        "from django_redlock import LockManager\n"
        "manager = LockManager(sys.argv[1:], retry_delay=30.0)\n"
        "lease = manager.acquire('handed', ttl=1.0, timeout=120)\n"
        "print('got', lease.token, flush=True)\n"
        "lease.release()\n"
    ),
    "asyncio": (
        "import asyncio, sys\n"
        "from django_redlock import AsyncLockManager\n"
        "async def main():\n"
        "    manager = AsyncLockManager(sys.argv[1:], retry_delay=30.0)\n"
        "    lease = await manager.acquire('handed', ttl=1.0, timeout=120)\n"
        "    print('got', lease.token, flush=True)\n"
        "    await lease.release()\n"
        "    await manager.aclose()\n"
        "asyncio.run(main())\n"
    ),
}


def _holders(cluster) -> list[bytes | None]:
    out = []
    for node in cluster:
        with node_client(node) as client:
            out.append(lock_token(client, KEY))
    return out


def _registered(cluster, round_: int) -> bool:
    for node in cluster:
        with node_client(node) as client:
            entries = client.hgetall(KEY + "\x00h").values()
        if not any(entry.startswith(b"%d " % round_) for entry in entries):
            return False
    return True


def _wait_for(condition, seconds: float = 20.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def _line(stream, seconds: float) -> str | None:
    ready, _, _ = select.select([stream], [], [], seconds)
    return stream.readline() if ready else None


@pytest.mark.parametrize("kind", ["sync", "asyncio"])
def test_a_waiter_paused_past_its_grants_never_counts_them_when_it_wakes(cluster3, tmp_path, kind):
    # The waiter process is SIGSTOPped while it heads the line; the release grants it the lock
    # on every node (1 s ttl), and the grants run out while it sleeps. Another client takes
    # the lock. When the waiter wakes it reads the grants from its socket: counted from the
    # send time of the round they name, they have no validity left, so it tries again, is
    # refused, and gets the lock only when the other client releases.
    # Fails if grants are counted from when they are heard (the simulator's mutant
    # grant-counted-late): the waiter would print "got" while the other client holds.
    script = tmp_path / "waiter.py"
    script.write_text(WAITER[kind])
    holder = LockManager(cluster3.urls)
    lease = holder.acquire("handed", ttl=30.0)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    waiter = subprocess.Popen(
        [sys.executable, str(script), *cluster3.urls],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: _registered(cluster3, 2), 30.0)
        waiter.send_signal(signal.SIGSTOP)
        lease.release()  # granted to the sleeping waiter on every node
        hand = _holders(cluster3)[0]
        assert hand is not None
        assert _holders(cluster3) == [hand] * 3
        _wait_for(lambda: _holders(cluster3) == [None, None, None], 10.0)  # its 1 s ttl
        with LockManager(cluster3.urls) as late:
            taken = late.acquire("handed", ttl=30.0, timeout=10.0)
            waiter.send_signal(signal.SIGCONT)
            # Its grants are heard now; the lock is not its own while `taken` holds it.
            assert waiter.stdout is not None
            assert _line(waiter.stdout, 2.0) is None, "the woken waiter counted stale grants"
            assert _holders(cluster3) == [taken.token.encode()] * 3
            taken.release()
            got = _line(waiter.stdout, 30.0)
            assert got is not None
            assert got.startswith("got ")
        assert waiter.wait(30.0) == 0
    finally:
        waiter.send_signal(signal.SIGCONT)
        waiter.kill()
        waiter.wait()
        if waiter.stdout is not None:
            waiter.stdout.close()
        holder.close()


WORKERS = 5
CYCLES = 8


class _Exclusion:
    """Counts the holders inside the critical section at once (it must never pass 1), and
    checks each holder still has validity left when it enters."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.inside = 0
        self.most = 0
        self.entered = 0
        self.spent: list[float] = []

    def enter(self, validity: float) -> None:
        with self.lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
            self.entered += 1
            if validity <= 0:
                self.spent.append(validity)

    def leave(self) -> None:
        with self.lock:
            self.inside -= 1


def _disrupt(cluster, stop: threading.Event) -> None:
    """Pause one node at a time past the stall reset (1 s for a 50 ms node timeout), so
    clean-ups, yields and undos sit on stalled connections while later tries go on new ones;
    then set ``stop``."""
    for index in (1, 2, 1):
        with cluster[index].paused_while():
            time.sleep(1.3)
        time.sleep(0.3)
    stop.set()


def _count_hand_offs(monkeypatch) -> list[int]:
    """Count the leases held from grants (a spy on the flow; the nodes real), so a test
    that means to exercise the hand-off can tell that it did."""
    counted = [0]
    real = flow.Acquire.hear_grants

    def spy(self: flow.Acquire, grants: Any, now: float) -> flow.Granted | None:
        held = real(self, grants, now)
        counted[0] += held is not None
        return held

    monkeypatch.setattr(flow.Acquire, "hear_grants", spy)
    return counted


def _check_free(cluster) -> None:
    # Every lease was released and every grant freed or run out (ttl 5 s).
    _wait_for(lambda: all(holder is None for holder in _holders(cluster)), 15.0)


@pytest.mark.parametrize("size", [3, 5])
def test_waiters_threads_through_paused_nodes_never_overlap_and_all_finish(
    cluster3, cluster5, size, monkeypatch
):
    cluster = cluster3 if size == 3 else cluster5
    handed = _count_hand_offs(monkeypatch)
    seen = _Exclusion()
    errors: list[BaseException] = []
    stop = threading.Event()

    def work() -> None:
        try:
            with LockManager(cluster.urls, node_timeout=0.05, retry_delay=0.1) as manager:
                done = 0
                while done < CYCLES or not stop.is_set():  # through every pause
                    done += 1
                    lease = manager.acquire("handed", ttl=5.0, timeout=60.0)
                    seen.enter(lease.validity)
                    time.sleep(0.003)
                    seen.leave()
                    lease.release()
        except BaseException as exc:  # reported below
            errors.append(exc)

    disruptor = threading.Thread(target=_disrupt, args=(cluster, stop))
    workers = [threading.Thread(target=work) for _ in range(WORKERS)]
    disruptor.start()
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join(120.0)  # a hang guard, not a speed bound
    disruptor.join()
    assert not any(thread.is_alive() for thread in workers), "a waiter never got the lock"
    assert errors == []
    assert seen.most == 1
    assert seen.spent == []
    assert seen.entered >= WORKERS * CYCLES
    print(f"{seen.entered} critical sections, {handed[0]} from grants")
    assert handed[0] > 0
    _check_free(cluster)


@pytest.mark.parametrize("size", [3, 5])
def test_waiters_tasks_through_paused_nodes_never_overlap_and_all_finish(
    cluster3, cluster5, size, monkeypatch
):
    cluster = cluster3 if size == 3 else cluster5
    handed = _count_hand_offs(monkeypatch)
    seen = _Exclusion()
    stop = threading.Event()

    async def work() -> None:
        manager = AsyncLockManager(cluster.urls, node_timeout=0.05, retry_delay=0.1)
        try:
            done = 0
            while done < CYCLES or not stop.is_set():  # through every pause
                done += 1
                lease = await manager.acquire("handed", ttl=5.0, timeout=60.0)
                seen.enter(lease.validity)
                await asyncio.sleep(0.003)
                seen.leave()
                await lease.release()
        finally:
            await manager.aclose()

    async def main() -> None:
        await asyncio.wait_for(asyncio.gather(*(work() for _ in range(WORKERS))), 120.0)

    disruptor = threading.Thread(target=_disrupt, args=(cluster, stop))
    disruptor.start()
    try:
        asyncio.run(main())
    finally:
        disruptor.join()
    assert seen.most == 1
    assert seen.spent == []
    assert seen.entered >= WORKERS * CYCLES
    print(f"{seen.entered} critical sections, {handed[0]} from grants")
    assert handed[0] > 0
    _check_free(cluster)


def test_a_node_restarted_from_a_snapshot_grants_nothing_and_the_others_hand_over(cluster3):
    # Node 2 crashes and comes back from a snapshot taken while the waiter waited: the
    # holder's key, the line and the waiter's registration are back, and the marker names the
    # old process. The holder's release frees node 2's restored key but must not grant it to
    # the waiter (that node may have forgotten a holder since the snapshot); nodes 0 and 1
    # grant: a quorum of 3. Fails if hand_grant.lua skips the marker check.
    holder, waiter = LockManager(cluster3.urls), LockManager(cluster3.urls, retry_delay=30.0)
    lease = holder.acquire("handed", ttl=30.0)
    got: list[Any] = []
    thread = threading.Thread(target=lambda: got.append(waiter.acquire("handed", timeout=20.0)))
    thread.start()
    node = cluster3[2]
    snapshot = Path(node.directory) / f"{node.name}.rdb"
    try:
        _wait_for(lambda: _registered(cluster3, 2))
        with node_client(node) as client:
            client.save()
        node.restart(fresh=False)
        lease.release()
        thread.join(10.0)
        assert got, "the waiter did not get the lock from the two other grants"
        handed = got[0]
        holders = _holders(cluster3)
        assert holders[:2] == [handed.token.encode()] * 2
        assert holders[2] is None  # freed by the release, granted to nobody
        handed.release()
        assert _holders(cluster3) == [None, None, None]
    finally:
        thread.join(10.0)
        snapshot.unlink(missing_ok=True)  # later restarts of this node start empty
        holder.close()
        waiter.close()
