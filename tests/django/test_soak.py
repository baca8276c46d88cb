"""Tier 2: the long soak, opt-in. Every fault at once, for as long as you like, per seed.

    REDLOCK_SOAK_SECONDS=300 ./run test -m soak -p no:randomly
    REDLOCK_SOAK_SECONDS=60 REDLOCK_SOAK_SEEDS=7,8 ./run test -m soak

Five nodes of its own (it kills and restarts them) and four worker processes incrementing one
fenced ledger row (``tests/fence_worker.py soak``). A seeded nemesis pauses the lock holder
for longer than its lease, pauses other workers, pauses a minority and briefly a majority of
the nodes, and kills nodes and restarts them empty (quarantined for ``MAX_TTL``). Each seed is
printed; the same seed replays the same nemesis decisions (timings still vary with the load).

Invariants checked:
- no lost update: the row's value equals the number of accepted writes;
- accepted fencing tokens strictly increase in commit order;
- every acquire returns within ``timeout + node_timeout + 50 ms``, except those during which
  their own process was paused (the nemesis logs each pause on the shared monotonic clock).
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from django_redlock import LockManager
from django_redlock.localnodes import LocalCluster
from django_redlock.locks import lock_name
from tests.django.soaking import check_fenced_history, collect, pause_nodes, stop
from tests.testapp.models import Ledger

SECONDS = float(os.environ.get("REDLOCK_SOAK_SECONDS", "0"))
SEEDS = [int(seed) for seed in os.environ.get("REDLOCK_SOAK_SEEDS", "101,202,303").split(",")]
ROOT = Path(__file__).resolve().parents[2]
TTL = 0.3
NODE_TIMEOUT = 0.05
LOCK_TIMEOUT = 2.0  # the workers' lock_for timeout (tests/fence_worker.py)
BOUND = LOCK_TIMEOUT + NODE_TIMEOUT + 0.05
MAX_TTL = 2.0

pytestmark = [
    pytest.mark.soak,
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(SECONDS <= 0, reason="opt-in: set REDLOCK_SOAK_SECONDS"),
    pytest.mark.timeout(0),
]


@pytest.mark.parametrize("seed", SEEDS)
def test_soak(seed, tmp_path, settings):
    print(f"\nsoak seed={seed} for {SECONDS:g} s (REDLOCK_SOAK_SEEDS={seed} replays it)")
    rng = random.Random(seed)
    with LocalCluster(5) as cluster:
        settings.REDLOCK = {"NODES": cluster.urls, "TTL": 1.0, "MAX_TTL": MAX_TTL}
        ledger = Ledger.objects.create()
        timings = tmp_path / "timings.jsonl"
        env = {
            **os.environ,
            "DJANGO_SETTINGS_MODULE": "tests.settings",
            "REDLOCK_TEST_NODES": ",".join(cluster.urls),
            "REDLOCK_TEST_DB_NAME": str(connection.settings_dict["NAME"]),
            "REDLOCK_TEST_TTL": "1.0",  # the default; the workers ask for TTL itself
            "REDLOCK_TEST_MAX_TTL": str(MAX_TTL),
            "REDLOCK_TEST_NODE_TIMEOUT": str(NODE_TIMEOUT),
            "PYTHONUNBUFFERED": "1",
        }
        workers = [
            subprocess.Popen(
                [
                    *(sys.executable, "-m", "tests.fence_worker", "soak", str(ledger.pk)),
                    *(str(TTL), str(SECONDS), f"w{index}", str(timings)),
                ],
                cwd=ROOT,
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
            for index in range(4)
        ]
        by_pid = {worker.pid: worker for worker in workers}
        observer = LockManager(cluster.urls, ttl=TTL, node_timeout=NODE_TIMEOUT, max_ttl=MAX_TTL)
        pauses: list[tuple[int, float, float]] = []  # (pid, start, end), monotonic
        actions: dict[str, int] = {}

        def pause_worker(worker: subprocess.Popen[str], seconds: float) -> None:
            if worker.poll() is not None:
                return
            start = time.monotonic()
            worker.send_signal(signal.SIGSTOP)
            time.sleep(seconds)
            worker.send_signal(signal.SIGCONT)
            pauses.append((worker.pid, start, time.monotonic()))

        try:
            deadline = time.monotonic() + SECONDS
            while time.monotonic() < deadline and any(w.poll() is None for w in workers):
                roll = rng.random()
                if roll < 0.3:
                    action = "pause the holder past its lease"
                    owner = observer.holder(lock_name(ledger))
                    if owner is not None and owner.get("pid") in by_pid:
                        pause_worker(by_pid[owner["pid"]], rng.uniform(1.5, 2.5) * TTL)
                elif roll < 0.5:
                    action = "pause a worker"
                    pause_worker(rng.choice(workers), rng.uniform(0.05, 2 * TTL))
                elif roll < 0.7:
                    action = "pause a minority of nodes"
                    pause_nodes(rng.sample(cluster.nodes, rng.randint(1, 2)), rng.uniform(0.1, 1))
                elif roll < 0.8:
                    action = "pause a majority of nodes"
                    pause_nodes(rng.sample(cluster.nodes, 3), rng.uniform(0.05, 0.3))
                elif roll < 0.9:
                    action = "kill a node, restart it empty"
                    node = rng.choice(cluster.nodes)
                    node.kill()
                    time.sleep(rng.uniform(0.1, 0.5))
                    node.restart()  # not declared fresh: quarantined for MAX_TTL
                else:
                    action = "rest"
                actions[action] = actions.get(action, 0) + 1
                time.sleep(rng.uniform(0.0, 0.2))
            summaries = collect(workers, timeout=LOCK_TIMEOUT + 60)
        finally:
            stop(workers)
            observer.close()

    accepted = sum(summary["accepted"] for summary in summaries)
    refused = sum(summary["refused"] for summary in summaries)
    acquires = [json.loads(line) for line in timings.read_text().splitlines()]
    unpaused = [
        a
        for a in acquires
        if not any(
            pid == a["pid"] and start < a["end"] and end > a["start"] for pid, start, end in pauses
        )
    ]
    slowest = max((a["end"] - a["start"] for a in unpaused), default=0.0)
    print(
        f"soak seed={seed}: {actions}; {accepted} accepted, {refused} refused, "
        f"{len(acquires)} acquires ({len(unpaused)} never paused, slowest {slowest:.3f} s "
        f"of a {BOUND:.3f} s bound)"
    )
    assert accepted >= 1, f"seed {seed}: no progress at all"
    check_fenced_history(ledger, accepted, seed)
    late = [a for a in unpaused if a["end"] - a["start"] > BOUND]
    assert not late, f"seed {seed}: acquires over the {BOUND} s bound: {late[:5]}"
