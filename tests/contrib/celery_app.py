# mypy: disallow-untyped-decorators=False
# (Celery ships no type hints: app.task is an untyped decorator.)
"""The Celery app the tests in tests/contrib run in real ``celery worker`` processes.

Started as ``celery -A tests.contrib.celery_app worker ...`` by the fixtures, with the broker
(``REDLOCK_TEST_BROKER``, a node the fixtures start on TCP) and the lock nodes
(``REDLOCK_TEST_NODES``) in the environment. Django is set up from ``tests.settings``, so the
tasks use the default manager, ``django_redlock.get_manager()``; one task uses ``manager=``
as a non-Django user would.

Every task writes what it does to a journal (a list on the broker node, db 2), which the tests
read: the tests never guess from timing what a worker did.
"""

from __future__ import annotations

import json
import os
from typing import Any

import django
import redis
from celery import Celery, Task, current_task, shared_task

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.settings")
from django.apps import apps

if not apps.ready:
    django.setup()

from django_redlock import LockLost, LockManager, StaleFencingToken, lock_for
from django_redlock.contrib.celery import LockedTask, current_lease, locked_task

BROKER = os.environ.get("REDLOCK_TEST_BROKER", "redis://127.0.0.1:6399/0")
JOURNAL = "journal"

app = Celery("tests.contrib", broker=BROKER, backend=BROKER.rsplit("/", 1)[0] + "/1")
app.conf.update(
    task_serializer="json",
    result_serializer="json",
    accept_content=["json"],
    worker_prefetch_multiplier=1,
    broker_connection_retry_on_startup=True,
    task_store_errors_even_if_ignored=True,
)


def journal_client() -> redis.Redis:
    return redis.Redis.from_url(BROKER.rsplit("/", 1)[0] + "/2", socket_timeout=10)


def note(event: str, task: Task, job: str, **extra: Any) -> None:
    record = {
        "event": event,
        "id": task.request.id,
        "job": job,
        "retries": task.request.retries,
        "pid": os.getpid(),
        **extra,
    }
    with journal_client() as client:
        client.rpush(JOURNAL, json.dumps(record))


def work(task: Task, job: str, gate: str | None) -> str:
    """The task body: journal the start, wait for the test to open ``gate`` (if any), journal
    the end."""
    lease = current_lease()
    note("start", task, job, lock=lease.name if lease else None)
    if gate is not None:
        with journal_client() as client:
            client.blpop([gate], timeout=30)
    note("end", task, job)
    return str(task.request.id)


@app.task(bind=True)
@locked_task(key="job:{job}", on_busy="skip", ttl=2)
def skip_task(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@app.task(bind=True, max_retries=50)
@locked_task(key="job:{job}", on_busy="retry", ttl=2, retry_max_countdown=0.5)
def retry_task(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@app.task(bind=True)
@locked_task(key="job:{job}", on_busy="error", ttl=2)
def error_task(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@app.task(bind=True)
@locked_task(key="job:{job}", ttl=2)
def fail_task(self: Task, job: str, gate: str | None = None) -> str:
    note("start", self, job)
    raise ValueError(f"task for {job} failed")


@app.task(bind=True, max_retries=3)
@locked_task(key="job:{job}", ttl=2)
def retry_itself(self: Task, job: str, gate: str | None = None) -> str:
    """Asks for a retry on its first run (as user code does), then works."""
    if self.request.retries == 0:
        note("retrying", self, job)
        raise self.retry(countdown=1.5)
    return work(self, job, gate)


@app.task(
    bind=True,
    base=LockedTask,
    redlock={"key": "job:{job}", "once": True, "once_ttl": 3, "ttl": 2},
)
def once_task(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@app.task(bind=True)
@locked_task(key="job:{job}", once=True, once_ttl=3, ttl=2)
def once_decorated(self: Task, job: str, gate: str | None = None) -> str:
    """``once=True`` in the spelling the README shows for ``locked_task``: no base class."""
    return work(self, job, gate)


# The other spellings of once=True without a base class (issue 40): each is de-duplicated
# in apply_async, as once_decorated is (tests/contrib/test_celery_workers.py).


@app.task
@locked_task(key="job:{job}", once=True, once_ttl=3, ttl=2)
def once_unbound(job: str, gate: str | None = None) -> str:
    """``@app.task`` without ``bind=True``: Celery hides the function in a staticmethod."""
    return work(current_task, job, gate)


@shared_task(bind=True)
@locked_task(key="job:{job}", once=True, once_ttl=3, ttl=2)
def once_shared(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@shared_task
@locked_task(key="job:{job}", once=True, once_ttl=3, ttl=2)
def once_shared_unbound(job: str, gate: str | None = None) -> str:
    return work(current_task, job, gate)


class OnceClassBased(app.Task):  # type: ignore[name-defined,misc]  # app.Task: built per app, untyped
    """A class-based task whose ``run`` is locked (registered when the app is finalized)."""

    name = "tests.contrib.celery_app.once_class_based"

    @locked_task(key="job:{job}", once=True, once_ttl=3, ttl=2)
    def run(self, job: str, gate: str | None = None) -> str:
        return work(self, job, gate)


@app.on_after_finalize.connect
def register_class_based(sender: Celery, **_: Any) -> None:
    # app.register_task reads app.tasks, which would finalize the app at import.
    sender.register_task(OnceClassBased())


@app.task(
    bind=True,
    base=LockedTask,
    max_retries=3,
    redlock={"key": "job:{job}", "once": True, "once_ttl": 3, "ttl": 2},
)
def once_retry_itself(self: Task, job: str, gate: str | None = None) -> str:
    if self.request.retries == 0:
        note("retrying", self, job)
        raise self.retry(countdown=1.5)
    return work(self, job, gate)


@app.task(
    bind=True,
    base=LockedTask,
    redlock={"key": "job:{job}", "once": True, "once_ttl": 3, "once_raise": True, "ttl": 2},
)
def once_raise_task(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@app.task(
    bind=True,
    base=LockedTask,
    max_retries=50,
    redlock={
        "key": "job:{job}",
        "once": True,
        "once_ttl": 20,
        "ttl": 2,
        "on_busy": "retry",
        "retry_max_countdown": 0.5,
    },
)
def once_retry_busy(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@app.task(
    bind=True,
    base=LockedTask,
    redlock={"key": "job:{job}", "once": True, "once_ttl": 10, "ttl": 2},
)
def once_long_wait(self: Task, job: str, gate: str | None = None) -> str:
    """Enqueued with a countdown that uses most of its once_ttl: starts with little left."""
    return work(self, job, gate)


@app.task(
    bind=True,
    base=LockedTask,
    redlock={"key": "job:{job}", "once": True, "once_ttl": 20, "ttl": 2},
)
def once_enqueues_itself(self: Task, job: str) -> str:
    """Enqueues a new copy with its own key while it runs (a new task id: no retry)."""
    queue = self.request.delivery_info.get("routing_key")
    again = once_enqueues_itself.apply_async((job,), queue=queue)
    note("start", self, job, again=again.id)
    return str(again.id)


@app.task(
    bind=True,
    base=LockedTask,
    redlock={"key": "page:{job}:{page}", "once": True, "once_ttl": 20, "ttl": 2},
)
def once_paged(self: Task, job: str, page: int, gate: str) -> Any:
    """Page 0 replaces itself with page 1 (a common pattern: the message keeps its id)."""
    note("start", self, job, page=page)
    if page == 0:
        queue = self.request.delivery_info.get("routing_key")
        raise self.replace(once_paged.s(job, 1, gate).set(queue=queue))
    with journal_client() as client:
        client.blpop([gate], timeout=30)
    return page


@app.task(bind=True)
def collect(self: Task, results: Any, job: str) -> Any:
    """A chord body: notes that it ran."""
    note("body", self, job)
    return results


@app.task(
    bind=True,
    base=LockedTask,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=50,
    redlock={"key": "job:{job}", "ttl": 2, "on_busy": "retry", "retry_max_countdown": 0.5},
)
def late_task(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)


@app.task(bind=True)
@locked_task(key="job:{job}", ttl=1.5)
def lose_lease(self: Task, job: str, gate: str) -> str:
    """Holds the lock until the test opens ``gate`` (after taking the lock away), then
    checks its lease."""
    note("start", self, job)
    with journal_client() as client:
        client.blpop([gate], timeout=30)
    lease = current_lease()
    assert lease is not None
    try:
        lease.check()
    except LockLost as error:
        note("lost", self, job, reason=error.reason)
    else:
        note("still held", self, job)
    return "done"


@app.task(bind=True)
def fenced_write(self: Task, job: str, ledger_pk: int, gate: str) -> str:
    """Increments a fenced ledger row under ``lock_for`` (the README's advice for writes that
    must be refused to a holder whose lease silently ran out), after the test opens ``gate``;
    a refused write is journaled as "stale" and fails the task with ``StaleFencingToken``."""
    from tests.testapp.models import Ledger

    ledger = Ledger.objects.get(pk=ledger_pk)
    try:
        with lock_for(ledger, ttl=1.5) as lease:
            note("start", self, job, token=lease.fencing_token)
            with journal_client() as client:
                client.blpop([gate], timeout=30)
            ledger.value += 1
            ledger.writer = "task"
            ledger.save()
    except StaleFencingToken as error:
        note("stale", self, job, token=error.token)
        raise
    note("wrote", self, job)
    return "wrote"


_plain_manager: LockManager | None = None


def plain_manager() -> LockManager:
    """A core LockManager built without Django, as a non-Django user passes ``manager=``."""
    global _plain_manager
    if _plain_manager is None:
        nodes = [url for url in os.environ.get("REDLOCK_TEST_NODES", "").split(",") if url]
        timeout = float(os.environ.get("REDLOCK_TEST_NODE_TIMEOUT", "0.05"))
        _plain_manager = LockManager(nodes, ttl=2.0, retry_delay=0.02, node_timeout=timeout)
    return _plain_manager


@app.task(bind=True)
@locked_task(key=lambda job, gate=None: f"plain:{job}", manager=plain_manager, ttl=2)
def plain_task(self: Task, job: str, gate: str | None = None) -> str:
    return work(self, job, gate)
