"""Adversarial checks of the one-message hand-off (``scripts/hand_grant.lua``,
``core/flow.py``: ``Acquire.hear_grants``) on real nodes: paused waiters, paused nodes,
many waiters at once, sync and asyncio."""

from __future__ import annotations

import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from django_redlock import LockManager
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
