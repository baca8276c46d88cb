"""``once=True`` on the edges an adversarial test found, with real ``celery worker``
processes: copies in a group or chord, a revoked copy, ``self.replace`` with new
arguments, a quorum outage when a retrying task starts, and, without a worker, task ids
with brackets or too long for the origin and ``task_always_eager``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import pytest
from celery import chord, group

from django_redlock import LeaseHandle, LockManager, get_manager
from django_redlock.contrib.celery.once import HEADER, handle_in
from tests.contrib.conftest import WAIT, Journal, Worker, count, new_job

pytestmark = pytest.mark.slow

# Well below the 20 s once_ttl of once_retry_busy and once_paged: a key freed within this
# was freed on purpose, not by running out.
PROMPT = 10.0


@pytest.fixture(scope="module")
def solo(
    tmp_path_factory: pytest.TempPathFactory, celery_app: Any, _cluster3: Any, broker: Any
) -> Iterator[Worker]:
    log = tmp_path_factory.mktemp("solo") / "worker.log"
    worker = Worker("solo", "once-edges", log, _cluster3.urls, broker.url)
    try:
        yield worker
    finally:
        worker.kill_all()


def wait_until(predicate: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


@pytest.mark.usefixtures("redlock_nodes")
def test_a_group_and_a_chord_of_copies_with_one_key_complete(
    solo: Worker, celery_app: Any, journal: Journal
):
    # Celery fixes every member's id in advance and waits for each: a member cannot be
    # answered with another copy's result, so it is sent (the run lock still applies).
    job = new_job()
    members = group(celery_app.once_task.s(job), celery_app.once_task.s(job))
    assert len(members.apply_async(queue=solo.queue).get(timeout=WAIT)) == 2
    other = new_job()
    header = [celery_app.once_task.s(other), celery_app.once_task.s(other)]
    chord(header)(celery_app.collect.s(other).set(queue=solo.queue), queue=solo.queue)
    journal.wait_for(other, lambda events: count(events, "body") == 1, "the chord's body")


@pytest.mark.usefixtures("redlock_nodes")
def test_a_revoked_copy_frees_its_once_key(solo: Worker, celery_app: Any):
    job = new_job()
    first = celery_app.once_retry_busy.apply_async((job,), queue=solo.queue, countdown=2)
    first.revoke()
    # It never runs, so only the worker's task_revoked handler can free the key so soon.
    wait_until(lambda: get_manager().holder(f"once:job:{job}") is None, "the key", PROMPT)
    second = celery_app.once_retry_busy.apply_async((job,), queue=solo.queue)
    assert second.id != first.id
    assert second.get(timeout=WAIT) == second.id


@pytest.mark.usefixtures("redlock_nodes")
def test_a_replaced_copy_holds_the_once_key_of_its_new_arguments(
    solo: Worker, celery_app: Any, journal: Journal
):
    job, gate = new_job(), journal.gate()
    first = celery_app.once_paged.apply_async((job, 0, gate), queue=solo.queue)

    def page_one_started(events: list[dict[str, Any]]) -> bool:
        return any(e["event"] == "start" and e.get("page") == 1 for e in events)

    journal.wait_for(job, page_one_started, "page 1")
    manager = get_manager()
    assert manager.holder(f"once:page:{job}:1") is not None  # page 1 is de-duplicated
    wait_until(lambda: manager.holder(f"once:page:{job}:0") is None, "page 0's key", PROMPT)
    again = celery_app.once_paged.apply_async((job, 1, gate), queue=solo.queue)
    assert again.id == first.id  # replace keeps the message id: the running copy's
    journal.open(gate)
    wait_until(lambda: manager.holder(f"once:page:{job}:1") is None, "page 1's key", PROMPT)
    assert sum(e.get("page") == 1 for e in journal.events(job)) == 1


@pytest.mark.usefixtures("redlock_nodes")
def test_a_once_retry_task_outlives_a_quorum_outage_at_its_start(
    solo: Worker, celery_app: Any, journal: Journal, cluster3: Any
):
    # The once lease cannot be confirmed and the run lock has no quorum: the task retries
    # with the same once lease instead of needing a new one while the nodes are down.
    job = new_job()
    seen = solo.text().count("could not be renewed when task")
    # Enqueued while the nodes answer (the once lease needs a quorum), started 1 s later,
    # while two of the three are paused.
    result = celery_app.once_retry_busy.apply_async((job,), queue=solo.queue, countdown=1)
    with cluster3[0].paused_while(), cluster3[1].paused_while():
        wait_until(
            lambda: solo.text().count("could not be renewed when task") > seen, "the task start"
        )
    assert result.get(timeout=WAIT) == result.id
    assert count(journal.events(job), "start") == 1


@pytest.mark.usefixtures("redlock_nodes")
def test_a_task_id_with_brackets_is_found_by_a_second_enqueue(celery_app: Any):
    job = new_job()
    first = celery_app.once_task.apply_async(
        (job,), queue="nobody-listens", task_id=f"order[{job}]-a"
    )
    again = celery_app.once_task.apply_async((job,), queue="nobody-listens")
    assert again.id == first.id == f"order[{job}]-a"


def test_a_task_id_too_long_for_the_origin_is_refused(celery_app: Any):
    with pytest.raises(ValueError, match="task_id is too long for once=True"):
        celery_app.once_task.apply_async((new_job(),), queue="nobody-listens", task_id="x" * 1100)


@pytest.mark.usefixtures("redlock_nodes")
def test_an_eager_call_bypasses_once(celery_app: Any, journal: Journal, cluster3: Any):
    job = new_job()
    # Another manager (another process, say): this thread must not re-enter its lease.
    queued = LockManager(cluster3.urls).acquire(
        f"once:job:{job}", ttl=30.0, origin=f"celery-once:{celery_app.once_task.name}[queued]"
    )
    celery_app.app.conf.task_always_eager = True
    try:
        result = celery_app.once_task.delay(job)
    finally:
        celery_app.app.conf.task_always_eager = False
        queued.release()
    assert result.id != "queued"
    assert count(journal.events(job), "start") == 1


@pytest.mark.usefixtures("redlock_nodes")
def test_a_message_of_the_previous_version_keeps_its_once_key(
    solo: Worker, celery_app: Any, journal: Journal
):
    # Before 0.2 the header was a dict with the producer's token; a worker of this version
    # adopts that lease as it adopts a handle: the key stays the copy's while it runs (a
    # second enqueue finds it), and is freed when it ends, long before its 20 s once_ttl.
    job, gate = new_job(), journal.gate()
    task, task_id, name = celery_app.once_retry_busy, f"old-{new_job()}", f"once:job:{job}"
    manager = get_manager()
    lease = manager.acquire(
        name, ttl=20.0, blocking=False, origin=f"celery-once:{task.name}[{task_id}]"
    )
    header = {"name": name, "token": lease.token, "ttl": lease.ttl, "origin": lease.origin}
    lease.handle()  # this process lets go: the message owns the lease now
    celery_app.app.send_task(
        task.name, (job, gate), task_id=task_id, queue=solo.queue, headers={HEADER: header}
    )
    journal.wait_for(job, lambda events: count(events, "start") == 1, "the task to start")
    assert task.apply_async((job, gate), queue=solo.queue).id == task_id
    journal.open(gate)
    assert celery_app.app.AsyncResult(task_id).get(timeout=WAIT) == task_id
    wait_until(lambda: manager.holder(name) is None, "the key", PROMPT)
    assert count(journal.events(job), "start") == 1


@pytest.mark.usefixtures("redlock_nodes")
def test_a_copy_that_waited_most_of_once_ttl_gets_it_whole_when_it_starts(
    solo: Worker, celery_app: Any, journal: Journal
):
    # Adopting keeps what was left of the queued lease (2.5 s of its 10 here); the extend
    # at the start gives the copy its whole once_ttl back.
    job, gate = new_job(), journal.gate()
    first = celery_app.once_long_wait.apply_async((job, gate), queue=solo.queue, countdown=7.5)
    journal.wait_for(job, lambda events: count(events, "start") == 1, "the task to start")
    holder = get_manager().holder(f"once:job:{job}")
    assert holder is not None
    assert holder["ttl"] > 5.0  # renewed to its 10 s at the start, not the 2.5 s left
    journal.open(gate)
    assert first.get(timeout=WAIT) == first.id


@pytest.mark.usefixtures("redlock_nodes")
def test_the_header_of_either_version_is_read_and_a_malformed_one_ignored(
    caplog: pytest.LogCaptureFixture,
):
    manager = get_manager()
    token = "ab" * 20
    handle = LeaseHandle(name="once:job:x", key=manager.key("once:job:x"), token=token, ttl=3.0)
    now = SimpleNamespace(headers={HEADER: handle.dumps()})
    assert handle_in(manager, now) == handle
    old = SimpleNamespace(
        **{HEADER: {"name": "once:job:x", "token": token, "ttl": 3, "origin": None}}
    )
    assert handle_in(manager, old) == handle
    assert handle_in(manager, SimpleNamespace(headers={})) is None
    with caplog.at_level(logging.WARNING, logger="django_redlock.celery"):
        for bad in ("rlh1.garbage", {"name": "once:job:x", "token": "short", "ttl": 3}, 7):
            assert handle_in(manager, SimpleNamespace(headers={HEADER: bad})) is None
    assert caplog.text.count(f"ignoring a malformed {HEADER} header") == 3


@pytest.mark.usefixtures("redlock_nodes")
def test_a_copy_that_enqueues_its_own_key_while_running_gets_itself_back(
    solo: Worker, celery_app: Any, journal: Journal
):
    # The running copy's thread holds the adopted once lease: the core counts a second
    # acquire of it there as a re-entry, which must not hand that lease to a new message.
    job = new_job()
    first = celery_app.once_enqueues_itself.apply_async((job,), queue=solo.queue)
    assert first.get(timeout=WAIT) == first.id  # the new copy was not sent: it is this one
    assert count(journal.events(job), "start") == 1
    wait_until(lambda: get_manager().holder(f"once:job:{job}") is None, "the key", PROMPT)
