"""Every way a user may write a locked Celery task (issue 40) either works or is refused
where it is written: at declaration, with a ``TypeError`` that shows the spelling that works,
never by enqueueing duplicates.

These run in this process: the refusals need no worker, and ``once=True``'s de-duplication
happens in ``apply_async`` (an in-memory broker takes the one message; the ``once`` lease is
on the session's real lock nodes). That the worker then runs the copy once and frees the key,
for each spelling, is in test_celery_workers.py, on a real worker.

Celery keeps every ``@app.task``/``@shared_task`` function in a process-wide registry that
each app takes in when it is finalized: task names here are unique, and a spelling that would
poison that registry (a bare ``@locked_task`` under ``@shared_task``) runs in a subprocess.
"""

from __future__ import annotations

import uuid
from typing import Any, ClassVar

import pytest
from celery import Celery, shared_task
from celery.signals import before_task_publish

from django_redlock import get_manager
from django_redlock.contrib.celery import LockedTask, locked_task
from django_redlock.contrib.celery.once import HEADER

ORDER = r"@app.task\(bind=True\)\n    @locked_task\(key="


@pytest.fixture
def app() -> Any:
    # An in-memory broker: apply_async really sends, to nothing that runs it.
    return Celery(f"spellings{uuid.uuid4().hex[:6]}", broker="memory://", set_as_current=False)


def job() -> str:
    return uuid.uuid4().hex[:10]


def sent_once(task: Any) -> None:
    """Two enqueues of one key send one message, which carries the ``once`` lease; the
    second returns the first's id."""
    key = job()
    sent: list[tuple[str, object]] = []

    def published(headers: dict[str, Any], **_: Any) -> None:
        sent.append((headers["id"], headers.get(HEADER)))

    before_task_publish.connect(published, weak=False)
    try:
        first = task.apply_async((key,), queue="nobody-listens")
        again = task.delay(key)
    finally:
        before_task_publish.disconnect(published)
    assert again.id == first.id
    assert [task_id for task_id, _ in sent] == [first.id]
    assert isinstance(sent[0][1], str)  # the once lease's handle, for the worker to adopt
    holder = get_manager().holder(f"once:spell:{key}")
    assert holder is not None
    assert holder["origin"] == f"celery-once:{task.name}[{first.id}]"


# -- what works ---------------------------------------------------------------------------


@pytest.mark.parametrize("bind", [True, False], ids=["bind", "no-bind"])
def test_once_under_app_task_dedupes_with_and_without_bind(app, bind):
    if bind:

        @app.task(bind=True, name=f"spell.app_bound_{uuid.uuid4().hex}")
        @locked_task(key="spell:{key}", once=True)
        def task(self, key): ...

    else:

        @app.task(name=f"spell.app_unbound_{uuid.uuid4().hex}")
        @locked_task(key="spell:{key}", once=True)
        def task(key): ...

    sent_once(task)
    # The class keeps a plain str for its module: the hook that saw it is gone.
    assert type(type(task._get_current_object()).__module__) is str


@pytest.mark.parametrize("bind", [True, False], ids=["bind", "no-bind"])
def test_once_under_shared_task_dedupes_with_and_without_bind(app, bind):
    name = f"spell.shared_{uuid.uuid4().hex}"
    if bind:

        @shared_task(bind=True, name=name)
        @locked_task(key="spell:{key}", once=True)
        def task(self, key): ...

    else:

        @shared_task(name=name)
        @locked_task(key="spell:{key}", once=True)
        def task(key): ...

    # A shared task is built for each app as it is finalized: this app's own copy.
    sent_once(app.tasks[name])


def test_once_on_a_class_based_tasks_run_dedupes(app):
    class Report(app.Task):  # type: ignore[name-defined,misc]  # untyped, built per app
        name = f"spell.class_based_{uuid.uuid4().hex}"

        @locked_task(key="spell:{key}", once=True)
        def run(self, key): ...

        def apply_async(self, *args, **kwargs):
            # The class's own apply_async is kept, as what sends (after the once lease).
            self.sent = getattr(self, "sent", 0) + 1
            return super().apply_async(*args, **kwargs)

    report = app.register_task(Report())
    sent_once(report)
    assert report.sent == 1

    class Subclassed(LockedTask):
        name = f"spell.locked_subclass_{uuid.uuid4().hex}"
        redlock: ClassVar[dict[str, Any]] = {"key": "spell:{key}", "once": True}

        def run(self, key): ...

    sent_once(app.register_task(Subclassed()))


def test_locked_task_under_a_locked_task_base_and_the_redlock_option_dedupe(app):
    @app.task(base=LockedTask, name=f"spell.base_{uuid.uuid4().hex}")
    @locked_task(key="spell:{key}", once=True)
    def under_base(key): ...

    @app.task(
        base=LockedTask,
        name=f"spell.option_{uuid.uuid4().hex}",
        redlock={"key": "spell:{key}", "once": True},
    )
    def option(key): ...

    sent_once(under_base)
    sent_once(option)


@pytest.mark.parametrize("bind", [True, False], ids=["bind", "no-bind"])
def test_the_run_lock_alone_works_with_and_without_bind(app, bind):
    if bind:

        @app.task(bind=True, name=f"spell.run_bound_{uuid.uuid4().hex}")
        @locked_task(key="spell:{key}")
        def task(self, key):
            return get_manager().holder(f"spell:{key}")

    else:

        @app.task(name=f"spell.run_unbound_{uuid.uuid4().hex}")
        @locked_task(key="spell:{key}")
        def task(key):
            return get_manager().holder(f"spell:{key}")

    holder = task.apply(args=(job(),)).get()
    assert holder is not None  # held while the function ran
    assert holder["origin"].startswith(f"celery:{task.name}[")


# -- the last line of defence -----------------------------------------------------------


def test_a_task_class_that_was_never_seen_is_refused_when_it_runs(app):
    # The last line of defence, for a class the decorator could not see being built (here:
    # run set after the class exists): its copies carry no once lease, so it never runs as
    # if de-duplicated.
    locked = locked_task(key="spell:{key}", once=True)(lambda key: "ran")

    class Unseen(app.Task):  # type: ignore[name-defined,misc]  # untyped, built per app
        name = f"spell.unseen_{uuid.uuid4().hex}"

    Unseen.run = staticmethod(locked)
    unseen = app.register_task(Unseen())
    with pytest.raises(TypeError, match="once=True works in apply_async, which this task"):
        unseen.apply(args=(job(),)).get()
