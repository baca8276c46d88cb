"""What the two fenced soaks share: finishing the workers, and the fenced-history invariants."""

from __future__ import annotations

import itertools
import json
import signal
import subprocess
import time
from collections.abc import Iterable
from typing import Any

from django_redlock.localnodes import LocalNode
from tests.testapp.models import Ledger, WriteLog


def collect(workers: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    """Each worker's JSON summary (its last line), once it exits with status 0."""
    summaries = []
    for worker in workers:
        out, _ = worker.communicate(timeout=timeout)
        assert worker.returncode == 0
        summaries.append(json.loads(out.strip().splitlines()[-1]))
    return summaries


def stop(workers: list[subprocess.Popen[str]]) -> None:
    """Kill the workers still running (resumed first: a stopped process may hold a lock)."""
    for worker in workers:
        if worker.poll() is None:
            worker.send_signal(signal.SIGCONT)
            worker.kill()


def pause_nodes(nodes: Iterable[LocalNode], seconds: float) -> None:
    """SIGSTOP the nodes for ``seconds``, then resume them."""
    paused = list(nodes)
    for node in paused:
        node.pause()
    time.sleep(seconds)
    for node in paused:
        node.resume()


def check_fenced_history(ledger: Ledger, accepted: int, seed: int) -> None:
    """No lost or doubled update, and accepted tokens strictly increase in commit order."""
    log = list(WriteLog.objects.filter(ledger=ledger).order_by("id"))
    row = Ledger.objects.get(pk=ledger.pk)
    assert len(log) == accepted, f"seed {seed}"
    assert row.value == accepted, f"seed {seed}: lost or doubled updates"
    tokens = [entry.token for entry in log]
    assert all(a < b for a, b in itertools.pairwise(tokens)), f"seed {seed}: {tokens}"
    assert [entry.value for entry in log] == list(range(1, accepted + 1)), f"seed {seed}"
