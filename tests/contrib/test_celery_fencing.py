"""A fenced write from a real ``celery worker`` whose lease ran out while it was paused.

The README's advice for Celery tasks whose writes must be refused to a stale holder is
``lock_for(instance)`` inside the task (the run lock mints no token). This shows it end to
end: the worker process is stopped with SIGSTOP (a GC pause, a swapped-out VM) after it read
the row under its lease, the lease runs out, a newer holder writes, and when the worker
resumes its write is refused by the database. Nothing is lost, and the task fails with
``StaleFencingToken`` (its attributes intact in the result backend).
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from django.db import connection

from django_redlock import StaleFencingToken, lock_for
from tests.contrib.conftest import WAIT, Journal, Worker, count, new_job
from tests.testapp.models import Ledger

pytestmark = [
    pytest.mark.slow,
    pytest.mark.fencing,
    pytest.mark.django_db(transaction=True),
    pytest.mark.usefixtures("redlock_nodes"),
]


def wait_stopped(pid: int) -> None:
    """Until the kernel reports ``pid`` stopped (state T), so the test does not race the
    signal."""
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        if state == "T":
            return
        time.sleep(0.005)
    raise AssertionError(f"process {pid} never stopped")


def test_a_paused_workers_fenced_write_is_refused_and_the_task_fails_stale(
    start_worker: Callable[..., Worker], celery_app: Any, journal: Journal
):
    # The worker writes to this test's database (a transaction=True test: the row is
    # committed, so the worker's connection sees it).
    worker = start_worker(
        "solo", extra_env={"REDLOCK_TEST_DB_NAME": str(connection.settings_dict["NAME"])}
    )
    ledger = Ledger.objects.create()
    job, gate = new_job(), journal.gate()
    result = celery_app.fenced_write.apply_async((job, ledger.pk, gate), queue=worker.queue)
    (start,) = journal.wait_for(job, lambda events: count(events, "start") == 1, "the task")
    assert start["token"] == 1
    # -P solo: the main process runs the task, its renewal thread included.
    os.kill(worker.process.pid, signal.SIGSTOP)
    try:
        wait_stopped(worker.process.pid)
        # A newer holder: it gets the lock once the worker's 1.5 s lease has run out, mints
        # token 2 in the database, and writes.
        with lock_for(ledger, timeout=WAIT) as lease:
            assert lease.fencing_token == 2
            ledger.refresh_from_db()
            ledger.value += 1
            ledger.writer = "test"
            ledger.save()
        journal.open(gate)  # the worker goes on to its write as soon as it runs again
    finally:
        os.kill(worker.process.pid, signal.SIGCONT)
    result.get(timeout=WAIT, propagate=False)
    events = journal.events(job)
    assert [record["event"] for record in events] == ["start", "stale"]
    assert events[1]["token"] == 1
    assert result.state == "FAILURE"
    assert isinstance(result.result, StaleFencingToken)
    assert (result.result.name, result.result.token) == (f"testapp.ledger:{ledger.pk}", 1)
    # Nothing lost, nothing overwritten: the newer holder's write stands.
    row = Ledger.objects.get(pk=ledger.pk)
    assert (row.value, row.writer, row.fencing_token) == (1, "test", 2)
