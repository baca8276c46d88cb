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

import subprocess
import sys
import textwrap
import uuid
from typing import Any, ClassVar

import pytest
from celery import Celery, Task, shared_task
from celery.signals import before_task_publish

from django_redlock import get_manager
from django_redlock.contrib.celery import LockedTask, locked_task
from django_redlock.contrib.celery.once import HEADER
from tests.contrib.conftest import ROOT

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
@pytest.mark.usefixtures("redlock_nodes")
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
@pytest.mark.usefixtures("redlock_nodes")
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


@pytest.mark.usefixtures("redlock_nodes")
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


@pytest.mark.usefixtures("redlock_nodes")
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
@pytest.mark.usefixtures("redlock_nodes")
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


# -- what is refused where it is written --------------------------------------------------


@pytest.mark.parametrize("once", [True, False], ids=["once", "run-lock"])
def test_locked_task_over_app_task_is_refused_without_building_the_task(app, once):
    with pytest.raises(TypeError, match="not a Celery task") as raised:

        @locked_task(key="spell:{key}", once=once)
        @app.task(name=f"spell.over_{uuid.uuid4().hex}")
        def task(key): ...

    # The message shows the order that works, with the key that was given.
    assert "place it under @app.task" in str(raised.value)
    assert f"@locked_task(key='spell:{{key}}'{', once=True' if once else ''})" in str(raised.value)
    # Refused from the proxy's type alone: the task was not built, the app not finalized.
    assert not app.finalized


def test_locked_task_over_a_finalized_apps_task_is_refused(app):
    app.finalize()

    @app.task(name=f"spell.finalized_{uuid.uuid4().hex}")
    def task(key): ...

    assert isinstance(task, Task)  # a finalized app gives the task itself, not a proxy
    with pytest.raises(TypeError, match=rf"not a Celery task \({task.name}\)"):
        locked_task(key="spell:{key}", once=True)(task)


def test_locked_task_over_shared_task_is_refused():
    with pytest.raises(TypeError, match=r"not a Celery task \(the proxy .*\n\n    " + ORDER):

        @locked_task(key="spell:{key}", once=True)
        @shared_task(name=f"spell.over_shared_{uuid.uuid4().hex}")
        def task(key): ...


@pytest.mark.parametrize("bind", [True, False], ids=["bind", "no-bind"])
def test_a_bare_locked_task_under_app_task_is_refused_at_declaration(app, bind):
    # Without parentheses the function became the key, and @app.task got the decorator.
    with pytest.raises(TypeError, match=r"@locked_task needs its arguments \(here .*\.task "):

        @app.task(bind=bind)
        @locked_task
        def task(key): ...


def test_a_bare_locked_task_under_shared_task_is_refused_when_the_app_builds_it():
    # In a subprocess: @shared_task registers the decorator for every app finalized later.
    code = textwrap.dedent(
        """
        from celery import Celery, shared_task
        from django_redlock.contrib.celery import locked_task

        @shared_task
        @locked_task
        def task(key): ...

        app = Celery("bare", broker="memory://")
        try:
            app.finalize()
        except TypeError as error:
            print("refused:", error)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert "refused: @locked_task needs its arguments (here task became the lock's key)" in (
        done.stdout
    )


@pytest.mark.usefixtures("redlock_nodes")
def test_a_bare_locked_task_over_a_task_is_refused(app):
    with pytest.raises(TypeError, match="key must be a format string or a callable, not a Cel"):

        @locked_task
        @app.task(name=f"spell.bare_over_{uuid.uuid4().hex}")
        def task(key): ...

    with pytest.raises(TypeError, match=r"not a task class \(Task\)"):
        locked_task(Task)  # (a class-based task's class as the key)

    # A class that builds keys is a key callable as good as any.
    @app.task(name=f"spell.key_class_{uuid.uuid4().hex}")
    @locked_task(key=str)
    def by_class(key):
        return get_manager().holder(key)

    assert by_class.apply(args=(f"spell:{job()}",)).get() is not None


def test_locked_task_over_a_class_is_refused():
    with pytest.raises(TypeError, match=r"not a task class .*subclass LockedTask"):

        @locked_task(key="spell:{key}")
        class Report(Task):  # type: ignore[misc]  # Celery ships no type hints
            def run(self, key): ...

    with pytest.raises(TypeError, match="not a class"):
        locked_task(key="spell:{key}")(dict)

    with pytest.raises(TypeError, match="decorates a function, not 42"):
        locked_task(key="spell:{key}")(42)  # type: ignore[type-var]


def test_locked_options_given_twice_are_refused_when_the_class_is_built(app):
    @app.task(
        base=LockedTask,
        name=f"spell.twice_{uuid.uuid4().hex}",
        redlock={"key": "spell:{key}"},
        shared=False,  # in Celery's process-wide registry, it would fail every later app
    )
    @locked_task(key="spell:{key}")
    def task(key): ...

    with pytest.raises(TypeError, match="already a locked task: give its options once"):
        task.name  # noqa: B018  (evaluating the proxy builds the class)


@pytest.mark.usefixtures("redlock_nodes")
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
