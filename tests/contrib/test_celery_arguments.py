"""locked_task / LockedTask arguments: bad ones are refused early, naming the argument; the
lock name is built from the call's arguments (run in this process with ``task.apply``)."""

from __future__ import annotations

from typing import Any

import pytest
from celery import Celery

from django_redlock.contrib.celery import LockedTask, current_lease, locked_task


@pytest.fixture
def app() -> Any:
    return Celery("arguments", set_as_current=False)


@pytest.mark.parametrize(
    ("options", "error", "names"),
    [
        ({"on_busy": "wait"}, ValueError, "on_busy"),
        ({"ttl": 0}, ValueError, "ttl"),
        ({"ttl": "10"}, TypeError, "ttl"),
        ({"timeout": -1}, ValueError, "timeout"),
        ({"once_ttl": float("nan")}, ValueError, "once_ttl"),
        ({"retry_max_countdown": float("inf")}, ValueError, "retry_max_countdown"),
        ({"retry_first_countdown": 0}, ValueError, "retry_first_countdown"),
        ({"once": 1}, TypeError, "once"),
        ({"manager": "redis://x"}, TypeError, "manager"),
    ],
)
def test_bad_options_are_refused_at_decoration(options, error, names):
    with pytest.raises(error, match=names):
        locked_task("job:{job}", **options)


def test_a_key_field_that_is_not_an_argument_is_refused_at_decoration(app):
    with pytest.raises(ValueError, match=r"\{acount_id\}, which is not an argument"):

        @app.task(bind=True)
        @locked_task(key="report:{acount_id}")
        def report(self, account_id): ...

    with pytest.raises(ValueError, match=r"positional argument \{2\}"):
        locked_task(key="report:{2}")(lambda a, b: None)

    with pytest.raises(TypeError, match="key"):
        locked_task(key=42)  # type: ignore[arg-type]

    # bind=True: the task parameter ("self", Celery's convention) is not an argument.
    with pytest.raises(ValueError, match=r"positional argument \{1\}"):

        @app.task(bind=True)
        @locked_task(key="page:{1}")
        def paged(self, job): ...

    with pytest.raises(ValueError, match=r"\{self\}, which is not an argument"):

        @app.task(bind=True)
        @locked_task(key="page:{self}")
        def paged_by_self(self, job): ...


def test_locked_task_base_checks_its_redlock_option():
    # Celery makes a task's class when its app is finalized (at the latest when a worker
    # starts, or the task is first used): that is when the options are checked. shared=False:
    # in Celery's process-wide registry, these would fail every app finalized after them.
    app = Celery("arguments", set_as_current=False)

    @app.task(bind=True, base=LockedTask, redlock={"ttl": 5}, shared=False)
    def no_key(self, job): ...

    with pytest.raises(TypeError, match="needs a 'key'"):
        app.finalize()

    app = Celery("arguments", set_as_current=False)

    @app.task(base=LockedTask, redlock={"key": "x:{nope}"}, shared=False)
    def typo(job): ...

    with pytest.raises(ValueError, match=r"\{nope\}, which is not an argument"):
        typo.name  # noqa: B018  (evaluating the task makes its class)


@pytest.mark.usefixtures("redlock_nodes")
def test_the_name_is_built_from_positional_keyword_and_default_arguments(app, cluster3):
    @app.task(bind=True)
    @locked_task(key="r:{0}:{b}:{c}:{k}", ttl=2)
    def bound(self, a, b, c=3, **d):
        lease = current_lease()
        assert lease is not None
        return lease.name

    @app.task(base=LockedTask, redlock={"key": "s:{a}:{b}", "ttl": 2})
    def unbound(a, b=7):
        lease = current_lease()
        assert lease is not None
        return lease.name

    assert bound.apply(args=(1,), kwargs={"b": 2, "k": "v"}).get() == "r:1:2:3:v"
    assert unbound.apply(args=(5,)).get() == "s:5:7"


def test_a_field_missing_from_a_call_is_an_error_naming_it(app, cluster3):
    @app.task(bind=True)
    @locked_task(key="r:{region}")
    def anything(self, **options):
        return "ran"

    result = anything.apply(kwargs={"zone": "eu"})
    with pytest.raises(ValueError, match=r"refers to 'region', which this call .* does not give"):
        result.get()

    @app.task(bind=True)
    @locked_task(key=lambda job: 42)  # type: ignore[arg-type,return-value]
    def bad_callable(self, job):
        return "ran"

    with pytest.raises(TypeError, match="key callable must return a str"):
        bad_callable.apply(args=("x",)).get()


@pytest.mark.usefixtures("redlock_nodes")
def test_once_under_app_task_needs_no_base_class_with_or_without_bind(app, cluster3):
    # Celery registers every @app.task in its shared registry too, which each app takes in
    # when it is finalized: names unique in this file, or a later test warns of a duplicate.
    @app.task(bind=True)
    @locked_task(key="j:{job}", once=True)
    def once_bound(self, job):
        return "ran"

    # The class Celery built got LockedTask's apply_async when it was created.
    built = type(once_bound._get_current_object())  # @app.task gives a proxy until evaluated
    assert built.apply_async is not app.Task.apply_async
    assert "once" in (built.apply_async.__doc__ or "")
    assert once_bound.apply(args=("x",)).get() == "ran"

    # Without bind=True Celery wraps the function in a staticmethod: the class is seen
    # through the function's __module__ instead (it was refused when the task ran, issue 40).
    @app.task
    @locked_task(key="j:{job}", once=True)
    def once_unbound(job):
        return "ran"

    built = type(once_unbound._get_current_object())
    assert built.apply_async is not app.Task.apply_async
    assert "once" in (built.apply_async.__doc__ or "")
    assert once_unbound.apply(args=("x",)).get() == "ran"


def test_the_function_itself_is_not_a_task():
    @locked_task(key="j:{job}")
    def bare(job):
        return "ran"

    with pytest.raises(TypeError, match="call the task"):
        bare("x")


def test_a_busy_retry_comes_back_soon_and_backs_off_up_to_the_holders_lease():
    """issue 23: the countdown was the holder's whole remaining lease, so a task retried 30 s
    after a holder that was done in 3 s. Now: the first countdown (0.5 s) doubling each retry,
    jittered by +-25 %, never past the holder's lease or retry_max_countdown."""
    from django_redlock.contrib.celery.policy import make_policy
    from django_redlock.contrib.celery.run_lock import countdown

    policy = make_policy("job:{job}", on_busy="retry")
    middle = lambda low, high: (low + high) / 2  # noqa: E731 - the jitter's midpoint
    assert [countdown(30.0, policy, n, middle) for n in range(8)] == [
        0.5,
        1.0,
        2.0,
        4.0,
        8.0,
        16.0,
        30.0,
        30.0,
    ]
    assert countdown(30.0, policy, 0, lambda low, high: low) == 0.375
    assert countdown(30.0, policy, 0, lambda low, high: high) == 0.625
    assert countdown(1.2, policy, 5, middle) == 1.2  # the holder's lease ends sooner
    assert countdown(None, policy, 20, middle) == 60.0  # retry_max_countdown
    assert countdown(0.01, policy, 0, middle) == 0.1  # never a hot loop
    slow = make_policy("job:{job}", on_busy="retry", retry_first_countdown=5)
    assert countdown(30.0, slow, 1, middle) == 10.0
