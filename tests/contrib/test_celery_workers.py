"""django_redlock.contrib.celery with real ``celery worker`` processes (solo and prefork pools)
on a Redis broker node, and the locks on the session's three lock nodes.

What the workers did is read from the journal the tasks write (tests/contrib/celery_app.py)
and from the nodes; no test infers it from timing.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from django_redlock import LockContended, LockLost, QuorumUnreachable, get_manager
from django_redlock.contrib.celery import AlreadyQueued
from tests.contrib.conftest import WAIT, Journal, Worker, count, new_job
from tests.helpers import node_client

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("redlock_nodes")]


@pytest.fixture(scope="module")
def solo(
    tmp_path_factory: pytest.TempPathFactory, celery_app: Any, _cluster3: Any, broker: Any
) -> Iterator[Worker]:
    """One solo worker shared by the module's behaviour tests (each test has its own jobs)."""
    log = tmp_path_factory.mktemp("solo") / "worker.log"
    worker = Worker("solo", "solo", log, _cluster3.urls, broker.url)
    try:
        yield worker
    finally:
        worker.kill_all()


def wait_until(predicate: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def origin(app: Any, task: str, task_id: str) -> str:
    return f"celery:tests.contrib.celery_app.{task}[{task_id}]"


# -- the run lock: busy behaviours ----------------------------------------------------------


def test_busy_task_is_skipped_and_the_holder_logged(
    solo: Worker, celery_app: Any, journal: Journal
):
    job = new_job()
    manager = get_manager()
    with manager.lock(f"job:{job}", ttl=20, origin="test:the-holder"):
        result = celery_app.skip_task.apply_async((job,), queue=solo.queue)
        assert result.get(timeout=WAIT) is None
    assert journal.events(job) == []  # the body never ran
    lines = solo.text().splitlines()
    line = next(line for line in lines if result.id in line and "skipped" in line)
    assert f"lock 'job:{job}' is held by " in line
    assert "(test:the-holder) since " in line
    # Free again: the same task runs, and lets the lock go when it returns.
    rerun = celery_app.skip_task.apply_async((job,), queue=solo.queue)
    assert rerun.get(timeout=WAIT) == rerun.id
    assert [record["event"] for record in journal.events(job)] == ["start", "end"]
    assert journal.events(job)[0]["lock"] == f"job:{job}"
    assert manager.holder(f"job:{job}") is None


def test_busy_task_fails_with_lock_contended(solo: Worker, celery_app: Any, journal: Journal):
    job = new_job()
    with get_manager().lock(f"job:{job}", ttl=20, origin="test:the-holder"):
        result = celery_app.error_task.apply_async((job,), queue=solo.queue)
        result.get(timeout=WAIT, propagate=False)
    assert result.state == "FAILURE"
    # The core's errors keep their constructor's arguments: Celery rebuilds the real class.
    assert isinstance(result.result, LockContended)
    assert result.result.name == f"job:{job}"
    assert f"lock 'job:{job}' not acquired" in str(result.result)
    failing = f"failing {origin(celery_app, 'error_task', result.id)}: lock 'job:{job}' is held"
    assert re.search(
        re.escape(failing) + r" by \S+ pid \d+ \(test:the-holder\) since ", solo.text()
    )
    assert journal.events(job) == []


def test_busy_task_is_retried_with_celerys_countdown_until_free(
    solo: Worker, celery_app: Any, journal: Journal
):
    job = new_job()
    lease = get_manager().acquire(f"job:{job}", ttl=20, origin="test:the-holder")
    try:
        result = celery_app.retry_task.apply_async((job,), queue=solo.queue)
        retrying = f"retrying {origin(celery_app, 'retry_task', result.id)}"
        wait_until(
            lambda: solo.text().count(retrying) >= 2,
            "two retries while the lock is held",
        )
        assert journal.events(job) == []
    finally:
        lease.release()
    assert result.get(timeout=WAIT) == result.id
    (start,) = [record for record in journal.events(job) if record["event"] == "start"]
    assert start["retries"] >= 2  # Celery's own retry count: self.retry was used
    assert get_manager().holder(f"job:{job}") is None


def test_lock_is_released_on_failure(solo: Worker, celery_app: Any, journal: Journal):
    job = new_job()
    result = celery_app.fail_task.apply_async((job,), queue=solo.queue)
    result.get(timeout=WAIT, propagate=False)
    assert result.state == "FAILURE"
    assert isinstance(result.result, ValueError)  # the task's own error, not a lock error
    assert count(journal.events(job), "start") == 1
    assert get_manager().holder(f"job:{job}") is None


def test_lock_is_not_held_across_a_retry(solo: Worker, celery_app: Any, journal: Journal):
    job = new_job()
    manager = get_manager()
    result = celery_app.retry_itself.apply_async((job,), queue=solo.queue)
    journal.wait_for(job, lambda events: count(events, "retrying") == 1, "the first run")
    # Between the first run (which asked for a retry in 1.5 s) and the retried run, the lock
    # is free: someone else could take it.
    free_before_retry = False
    deadline = time.monotonic() + WAIT
    while time.monotonic() < deadline and count(journal.events(job), "start") == 0:
        if manager.holder(f"job:{job}") is None and count(journal.events(job), "start") == 0:
            free_before_retry = True
            break
        time.sleep(0.02)
    assert free_before_retry, journal.events(job)
    assert result.get(timeout=WAIT) == result.id
    assert journal.events(job)[-2]["retries"] == 1


def test_origin_names_the_task_and_id_with_a_plain_manager(
    solo: Worker, celery_app: Any, journal: Journal
):
    """``manager=`` (a core LockManager built without Django) and a callable key."""
    job, gate = new_job(), journal.gate()
    result = celery_app.plain_task.apply_async((job, gate), queue=solo.queue)
    journal.wait_for(job, lambda events: count(events, "start") == 1, "the task to start")
    holder = get_manager().holder(f"plain:{job}")
    assert holder is not None
    assert holder["origin"] == origin(celery_app, "plain_task", result.id)
    journal.open(gate)
    assert result.get(timeout=WAIT) == result.id
    assert get_manager().holder(f"plain:{job}") is None


def test_lease_lost_mid_task_is_seen_at_check(solo: Worker, celery_app: Any, journal: Journal):
    job, gate = new_job(), journal.gate()
    manager = get_manager()
    result = celery_app.lose_lease.apply_async((job, gate), queue=solo.queue)
    journal.wait_for(job, lambda events: count(events, "start") == 1, "the task to start")
    # An operator force-releases the lock and another holder takes it: the worker's lease is
    # gone. Its renewal (every 0.5 s) fails, and its own 1.5 s lease ends by its clock.
    manager.force_release(f"job:{job}")
    with manager.lock(f"job:{job}", ttl=20, origin="test:the-new-holder"):
        time.sleep(1.6)  # not an assertion: past any validity the worker's lease could have
        journal.open(gate)
        result.get(timeout=WAIT, propagate=False)
    assert [record["event"] for record in journal.events(job)] == ["start", "lost"]
    # The task's work may have overlapped the new holder's: it fails, visibly.
    assert result.state == "FAILURE"
    assert isinstance(result.result, LockLost)
    assert f"lock 'job:{job}' lost" in str(result.result)


# -- once=True ------------------------------------------------------------------------------


def test_once_returns_the_queued_copy_and_the_key_runs_out(celery_app: Any, broker: Any):
    """No worker listens: the copies stay queued. A second enqueue returns the first's
    AsyncResult (or raises AlreadyQueued); the key expires by itself after once_ttl."""
    job = new_job()
    manager = get_manager()
    first = celery_app.once_task.apply_async((job,), queue="nobody-listens")
    second = celery_app.once_task.delay(job)
    assert second.id == first.id
    with node_client(broker) as client:
        assert client.llen("nobody-listens") == 1  # one message, not two
    holder = manager.holder(f"once:job:{job}")
    assert holder is not None
    assert holder["origin"] == f"celery-once:tests.contrib.celery_app.once_task[{first.id}]"
    assert holder["ttl"] <= 3.0
    with pytest.raises(AlreadyQueued) as raised:
        celery_app.once_raise_task.apply_async((job,), queue="nobody-listens")
    assert raised.value.task_id == first.id
    assert raised.value.name == f"once:job:{job}"
    # Nobody consumes it: the key is not stuck, it runs out within once_ttl (3 s).
    wait_until(lambda: manager.holder(f"once:job:{job}") is None, "the once key to run out")
    third = celery_app.once_task.apply_async((job,), queue="nobody-listens")
    assert third.id != first.id


def test_once_dedupes_while_running_and_frees_the_key_when_done(
    solo: Worker, celery_app: Any, journal: Journal
):
    job, gate = new_job(), journal.gate()
    first = celery_app.once_task.apply_async((job, gate), queue=solo.queue)
    journal.wait_for(job, lambda events: count(events, "start") == 1, "the task to start")
    time.sleep(3.5)  # past once_ttl (3 s): only the worker's renewal can keep the key now
    again = celery_app.once_task.apply_async((job, gate), queue=solo.queue)
    assert again.id == first.id
    journal.open(gate)
    assert first.get(timeout=WAIT) == first.id
    assert get_manager().holder(f"once:job:{job}") is None  # cleared by the worker
    later = celery_app.once_task.apply_async((job,), queue=solo.queue)
    assert later.id != first.id
    assert later.get(timeout=WAIT) == later.id
    assert count(journal.events(job), "start") == 2


@pytest.mark.parametrize(
    "name",
    [
        "once_decorated",  # @app.task(bind=True) over @locked_task(..., once=True)
        "once_unbound",  # @app.task without bind=True
        "once_shared",  # @shared_task(bind=True)
        "once_shared_unbound",  # @shared_task
        "once_class_based",  # class Task(app.Task) whose run is @locked_task(..., once=True)
    ],
)
def test_once_without_a_base_class_in_every_spelling(
    solo: Worker, celery_app: Any, journal: Journal, broker: Any, name: str
):
    """``@locked_task(..., once=True)`` under ``@app.task`` or ``@shared_task``, with or
    without ``bind=True``, or on a class-based task's ``run``: the second enqueue sends
    nothing and returns the first copy; the worker runs it once and frees the key. (Without
    ``bind=True`` every duplicate was sent, and failed in the worker, before issue 40.)"""
    job, gate = new_job(), journal.gate()
    task = celery_app.app.tasks[f"tests.contrib.celery_app.{name}"]
    first = task.apply_async((job,), {"gate": gate}, queue="nobody-listens")
    second = task.delay(job, gate=gate)
    assert second.id == first.id
    with node_client(broker) as client:
        assert client.llen("nobody-listens") == 1  # one message, not two
    holder = get_manager().holder(f"once:job:{job}")
    assert holder is not None
    assert holder["origin"] == f"celery-once:{task.name}[{first.id}]"
    # A worker runs the queued copy once, and frees the key when it ends.
    running = task.apply_async((job + "-run",), {"gate": gate}, queue=solo.queue)
    assert task.delay(job + "-run", gate=gate).id == running.id
    journal.wait_for(job + "-run", lambda events: count(events, "start") == 1, "the task")
    journal.open(gate)
    assert running.get(timeout=WAIT) == running.id
    assert count(journal.events(job + "-run"), "start") == 1
    assert get_manager().holder(f"once:job:{job}-run") is None


def test_once_key_is_handed_to_the_retry(solo: Worker, celery_app: Any, journal: Journal):
    job = new_job()
    first = celery_app.once_retry_itself.apply_async((job,), queue=solo.queue)
    journal.wait_for(job, lambda events: count(events, "retrying") == 1, "the first run")
    # The first run is over (Celery stored RETRY after it returned), and the retry waits in
    # the queue (1.5 s countdown) or has just started: the key stays taken by it.
    wait_until(lambda: first.state == "RETRY" or count(journal.events(job), "start") > 0, "RETRY")
    again = celery_app.once_retry_itself.apply_async((job,), queue=solo.queue)
    assert again.id == first.id
    assert first.get(timeout=WAIT) == first.id
    assert count(journal.events(job), "start") == 1
    assert get_manager().holder(f"once:job:{job}") is None


# -- killed workers ---------------------------------------------------------------------------


def test_sigkilled_worker_leaves_keys_that_run_out_within_their_ttl(
    start_worker: Callable[..., Worker], celery_app: Any, journal: Journal
):
    worker = start_worker("solo")
    job, gate = new_job(), journal.gate()
    manager = get_manager()
    result = celery_app.once_task.apply_async((job, gate), queue=worker.queue)
    journal.wait_for(job, lambda events: count(events, "start") == 1, "the task to start")
    assert manager.holder(f"job:{job}") is not None
    worker.kill_main()  # -P solo: the process running the task; its renewals stop with it
    run_lock, once_key = manager.holder(f"job:{job}"), manager.holder(f"once:job:{job}")
    assert run_lock is None or run_lock["ttl"] <= 2.0  # the task's ttl
    assert once_key is None or once_key["ttl"] <= 3.0  # once_ttl
    wait_until(
        lambda: manager.holder(f"job:{job}") is None and manager.holder(f"once:job:{job}") is None,
        "both keys to run out",
    )
    # Nobody had to remove anything: the next enqueue is a new task and takes the lock.
    again = celery_app.once_task.apply_async((job,), queue="nobody-listens")
    assert again.id != result.id
    with manager.lock(f"job:{job}", ttl=5, blocking=False):
        pass


def test_late_ack_task_is_redelivered_after_its_process_is_sigkilled(
    start_worker: Callable[..., Worker], celery_app: Any, journal: Journal
):
    """Prefork pool, acks_late + reject_on_worker_lost: the pool process running the task is
    SIGKILLed; Celery puts the message back, a new pool process runs it again, and takes the
    lock only once the dead process's lease has run out (never two holders)."""
    worker = start_worker("prefork")
    job, gate = new_job(), journal.gate()
    manager = get_manager()
    result = celery_app.late_task.apply_async((job, gate), queue=worker.queue)
    (start,) = journal.wait_for(job, lambda events: count(events, "start") == 1, "the first run")
    first_pid = start["pid"]
    assert first_pid != worker.process.pid  # a pool process, not the main one
    os.kill(first_pid, signal.SIGKILL)
    events = journal.wait_for(job, lambda events: count(events, "start") == 2, "the redelivery")
    second = events[-1]
    assert second["id"] == result.id
    assert second["pid"] != first_pid
    holder = manager.holder(f"job:{job}")
    assert holder is not None
    assert holder["pid"] == second["pid"]
    assert holder["origin"] == origin(celery_app, "late_task", result.id)
    journal.open(gate)
    assert result.get(timeout=WAIT) == result.id
    assert manager.holder(f"job:{job}") is None


# -- faults on the lock nodes ---------------------------------------------------------------


def test_once_and_the_run_lock_work_with_a_minority_paused(
    solo: Worker, celery_app: Any, journal: Journal, cluster3: Any
):
    job, gate = new_job(), journal.gate()
    with cluster3[0].paused_while():
        first = celery_app.once_task.apply_async((job, gate), queue=solo.queue)
        journal.wait_for(job, lambda events: count(events, "start") == 1, "the task to start")
        assert celery_app.once_task.apply_async((job, gate), queue=solo.queue).id == first.id
        holder = get_manager().holder(f"job:{job}")
        assert holder is not None
        assert holder["origin"] == origin(celery_app, "once_task", first.id)
        assert holder["nodes"] <= 2  # the paused node cannot answer
        journal.open(gate)
        assert first.get(timeout=WAIT) == first.id
        assert get_manager().holder(f"once:job:{job}") is None


def test_once_sends_nothing_without_a_quorum(celery_app: Any, cluster3: Any, broker: Any):
    job = new_job()
    with (
        cluster3[0].paused_while(),
        cluster3[1].paused_while(),
        pytest.raises(QuorumUnreachable),
    ):
        celery_app.once_task.apply_async((job,), queue="nobody-listens")
    with node_client(broker) as client:
        assert client.llen("nobody-listens") == 0  # no message reached the queue
