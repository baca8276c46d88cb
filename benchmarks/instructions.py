"""W1i: client instructions per acquire + release pair, counted by valgrind's callgrind.

Wall time on a shared 2-core VM moves by about ±20 % between runs; the count of instructions
the client process executes does not (callgrind counts them, user space only, whatever else
the machine is doing). So a change to the client's hot path is judged here first, and by W1's
wall times second. What it does not see: system calls (the kernel's side of every ``send``
and ``recv``) and the servers, which W1 measures.

Each contender runs in a child process under ``valgrind --tool=callgrind``, twice: once with
no pairs and once with ``pairs`` pairs, both after the same warm-up; the difference divided by
``pairs`` is the cost of one pair. Every contender has a 2 s socket timeout here (the client
runs about 50 times slower under valgrind; the servers, not under valgrind, do not).

Run: ``./run bench --only w1i`` (skipped with a note when valgrind is not installed).
"""

from __future__ import annotations

import math
import re
import shutil
import subprocess
import sys
from collections.abc import Callable

from django_redlock.localnodes import LocalCluster

WARM_UP = 200
TIMEOUT = 2.0  # seconds: the client is slow under valgrind, the servers are not

PairRunner = Callable[[str], bool]


def natively_paced() -> None:
    """Keep the sync transport's idle check (``_IDLE`` in ``wire/sync/connections.py``: after
    5 ms unused, a connection set polls its sockets before sending) out of a pair measured
    under valgrind, as it is out of the same loop run natively.

    Natively a W1 loop sends its next round well within 5 ms, so the check never fires. Under
    valgrind the client runs about 50 times slower, the gap between two rounds comes close to
    5 ms, and the extra poll fired in some rounds and not in others: the same tree's totals
    moved by thousands of instructions per pair between runs (h47, issue 43).
    """
    from django_redlock.wire.sync import connections

    if not hasattr(connections, "_IDLE"):  # renamed: this would silently measure nothing new
        raise RuntimeError("wire/sync/connections.py has no _IDLE: update natively_paced")
    connections._IDLE = math.inf


def _runner(contender: str, urls: list[str]) -> PairRunner:
    if contender in ("ours-5", "ours-3"):
        from django_redlock import LockManager

        natively_paced()
        manager = LockManager(urls, ttl=10.0, node_timeout=TIMEOUT)

        def ours(name: str) -> bool:
            manager.acquire(name, blocking=False).release()
            return True

        return ours
    if contender == "raw-5":
        from benchmarks.references import raw_sockets

        return raw_sockets(urls)
    if contender == "minimal-5":
        from benchmarks.minimal_redlock import MinimalRedlock

        floor = MinimalRedlock(urls, TIMEOUT)

        def minimal(name: str) -> bool:
            held = floor.acquire(f"redlock:{name}", 10_000)
            return held is not None and floor.release(held)

        return minimal
    if contender == "floor-5":
        from benchmarks.floor import SameCommandsRedlock

        same = SameCommandsRedlock(urls, TIMEOUT)

        def same_commands(name: str) -> bool:
            held = same.acquire(f"redlock:{name}", 10_000)
            return held is not None and same.release(held)

        return same_commands
    if contender == "redis-py-connections-5":
        from benchmarks.references import redis_py_connections

        return redis_py_connections(urls)
    if contender == "redis-py-1":
        import redis

        client = redis.Redis.from_url(urls[0], socket_timeout=TIMEOUT)

        def redis_py(name: str) -> bool:
            lock = client.lock(name, timeout=10.0)
            if not lock.acquire(blocking=False):
                return False
            lock.release()
            return True

        return redis_py
    raise ValueError(contender)


def child(contender: str, pairs: int, urls: list[str]) -> None:
    """The measured process: warm up, then run ``pairs`` pairs (each on a fresh key)."""
    run = _runner(contender, urls)
    for index in range(WARM_UP):
        if not run(f"w1i:warm:{contender}:{index}"):
            raise SystemExit(f"{contender}: a warm-up pair failed")
    for index in range(pairs):
        if not run(f"w1i:{contender}:{index}"):
            raise SystemExit(f"{contender}: a pair failed")


_COLLECTED = re.compile(rb"Collected : (\d+)")


def _instructions(
    contender: str, pairs: int, urls: list[str], module: str = "benchmarks.instructions"
) -> int:
    command = [
        "valgrind",
        "--tool=callgrind",
        "--callgrind-out-file=/dev/null",
        sys.executable,
        "-m",
        module,
        contender,
        str(pairs),
        *urls,
    ]
    done = subprocess.run(command, capture_output=True, timeout=600, check=False)
    found = _COLLECTED.search(done.stderr)
    if done.returncode != 0 or found is None:
        raise RuntimeError(f"{contender}: valgrind failed:\n{done.stderr.decode()[-2000:]}")
    return int(found[1])


def per_pair(
    contender: str, pairs: int, urls: list[str], module: str = "benchmarks.instructions"
) -> float:
    """Client instructions per pair of ``contender`` on the nodes ``urls``; ``module`` is
    the one whose ``python -m`` runs the measured child (``benchmarks/cluster.py`` has its
    own: ``<contender> <pairs> <urls...>``, as this module's)."""
    base = _instructions(contender, 0, urls, module)
    return (_instructions(contender, pairs, urls, module) - base) / pairs


def w1i(cluster3: LocalCluster, cluster5: LocalCluster, pairs: int = 2000) -> None:
    print(f"\nW1i: client instructions per acquire + release pair (callgrind, {pairs} pairs)")
    if shutil.which("valgrind") is None:
        print("  skipped: valgrind is not installed (apt install valgrind)")
        return
    one = [cluster5.urls[0]]
    contenders = (
        ("django_redlock N=5", "ours-5", cluster5.urls),
        ("django_redlock N=3", "ours-3", cluster3.urls),
        ("redis-py `Lock` (1 node)", "redis-py-1", one),
        ("reference: minimal Redlock, N=5", "minimal-5", cluster5.urls),
        ("reference: same-commands floor, N=5", "floor-5", cluster5.urls),
        ("reference: raw sockets, N=5", "raw-5", cluster5.urls),
        ("reference: redis-py Connections, N=5", "redis-py-connections-5", cluster5.urls),
    )
    counts: dict[str, float] = {}
    print(f"{'contender':40} {'instructions':>13}")
    for label, contender, urls in contenders:
        counts[contender] = per_pair(contender, pairs, urls)
        print(f"{label:40} {counts[contender]:13,.0f}")
    print("ratios (same run):")
    print(f"  N=5 / redis-py 1 node = {counts['ours-5'] / counts['redis-py-1']:.2f}x")
    print(f"  N=5 / raw sockets     = {counts['ours-5'] / counts['raw-5']:.2f}x")
    minimal = counts["ours-5"] / counts["minimal-5"]
    print(f"  N=5 / minimal Redlock = {minimal:.2f}x  (fewer is better; target <= 1.2x)")
    # ours / minimal = the client's share x the client side of the scripts' share (building
    # and sending the longer commands, parsing their replies; the servers' side of it is
    # ``benchmarks/script_cost.py``'s, which callgrind on the client does not see).
    print("decomposition (client instructions; ours / minimal = client's x scripts' share):")
    client, scripts = counts["ours-5"] / counts["floor-5"], counts["floor-5"] / counts["minimal-5"]
    print(f"  N=5: client's share, ours / floor    = {client:.2f}x")
    print(f"  N=5: scripts' share, floor / minimal = {scripts:.2f}x")


if __name__ == "__main__":
    child(sys.argv[1], int(sys.argv[2]), sys.argv[3:])
