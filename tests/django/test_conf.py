"""Settings: read lazily, rebuilt on change, every node spelling, passwords kept hidden."""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import gc
import inspect
import math
import re
import secrets
import sys
import weakref
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory, override_settings
from django.views.debug import ExceptionReporter

from django_redlock import LockManager, conf, default_manager, get_manager
from django_redlock.core.untracking import UNTRACK_AT
from django_redlock.exceptions import LockContended
from django_redlock.signals import SignalObserver, lock_acquired, lock_busy, observed_manager


@pytest.mark.usefixtures("redlock_nodes")
def test_the_manager_is_built_from_settings_and_rebuilt_when_they_change(settings, cluster3):
    manager = get_manager()
    assert manager is get_manager()
    assert manager.nodes == tuple(f"{url}?db=0" for url in cluster3.urls)
    assert manager.retry_delay == 0.01
    settings.REDLOCK = {"NODES": cluster3.urls[:1], "TTL": 12.5}
    rebuilt = get_manager()
    assert rebuilt is not manager
    assert rebuilt.ttl == 12.5
    assert len(rebuilt.nodes) == 1
    with override_settings(REDLOCK={"NODES": cluster3.urls, "KEY_PREFIX": "other:"}):
        assert get_manager().key_prefix == "other:"
    assert get_manager().key_prefix == "redlock:"


def test_importing_the_app_reads_no_settings():
    # conf.py and default_manager.py hold no parsed state until asked.
    default_manager.reset()
    assert conf._settings is None
    assert default_manager._manager is None


def test_an_invalid_setting_is_improperly_configured_with_the_check_id(settings):
    settings.REDLOCK = {"NODES": [], "TTL": -1}
    with pytest.raises(ImproperlyConfigured, match=r"E003.*") as info:
        get_manager()
    assert "django_redlock.E006" in str(info.value)


def test_a_dict_node_keeps_its_password_out_of_the_url(settings, cluster3):
    settings.REDLOCK = {
        "NODES": [{"URL": "redis://127.0.0.1:6390/1", "PASSWORD": "hunter2", "USERNAME": "app"}]
    }
    (address,) = get_manager().addresses
    assert (address.host, address.port, address.db) == ("127.0.0.1", 6390, 1)
    assert (address.username, address.password) == ("app", "hunter2")
    assert "hunter2" not in repr(get_manager())


@pytest.mark.parametrize(
    "backend",
    ["django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache"],
)
def test_a_cache_alias_node_takes_that_caches_location_and_password(settings, backend):
    settings.CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"},
        "locks": {
            "BACKEND": backend,
            "LOCATION": ["redis://10.0.0.7:6379/3", "redis://10.0.0.8:6379/3"],
            "OPTIONS": {"PASSWORD": "s3cret"},
        },
    }
    settings.REDLOCK = {"NODES": [{"CACHE": "locks"}]}
    (address,) = get_manager().addresses
    # The first location is the master; replicas never count as Redlock nodes.
    assert (address.host, address.port, address.db, address.password) == (
        "10.0.0.7",
        6379,
        3,
        "s3cret",
    )


def _debug_page(rf: RequestFactory) -> str:
    # Raised and caught here, so the traceback's frames hold no secret in their locals.
    try:
        raise RuntimeError("boom")
    except RuntimeError:
        return ExceptionReporter(rf.get("/"), *sys.exc_info()).get_traceback_html()


def test_the_debug_error_page_never_shows_a_node_password(settings, rf: RequestFactory):
    secret = secrets.token_hex(8)  # made at run time, so no source line on the page has it
    settings.DEBUG = True
    settings.REDLOCK = {
        "NODES": [{"URL": "redis://127.0.0.1:6390/0", "PASSWORD": secret}],
        "TTL": 30.0,
    }
    page = _debug_page(rf)
    assert "REDLOCK" in page
    assert "redis://127.0.0.1:6390/0" in page
    assert secret not in page


# -- one table, the core's own checks ------------------------------------------------------

# Nothing listens here: the settings are only parsed and the manager only built.
NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]
ARGUMENTS = re.compile(
    r"\b(ttl|max_ttl|node_timeout|retry_delay|drift_factor|key_prefix|default_timeout)\b"
)


@pytest.mark.parametrize(
    ("redlock", "check_id"),
    [
        ({"TTL": 0}, "django_redlock.E006"),
        ({"TTL": -1.5}, "django_redlock.E006"),
        ({"TTL": math.nan}, "django_redlock.E006"),
        ({"TTL": True}, "django_redlock.E006"),
        ({"TTL": "30"}, "django_redlock.E006"),
        ({"TTL": 86400.5}, "django_redlock.E006"),
        ({"TTL": 0.04}, "django_redlock.E006"),  # no longer than one attempt plus drift
        ({"TTL": 0.004, "NODE_TIMEOUT": 0.0004, "DRIFT_FACTOR": 0.4}, "django_redlock.E006"),
        ({"NODE_TIMEOUT": 0}, "django_redlock.E008"),
        ({"NODE_TIMEOUT": "fast"}, "django_redlock.E008"),
        ({"RETRY_DELAY": -1}, "django_redlock.E009"),
        ({"DRIFT_FACTOR": 0.5}, "django_redlock.E007"),
        ({"DRIFT_FACTOR": -0.1}, "django_redlock.E007"),
        ({"KEY_PREFIX": b"x"}, "django_redlock.E010"),
        ({"DEFAULT_TIMEOUT": -1}, "django_redlock.E011"),
        ({"DEFAULT_TIMEOUT": "1"}, "django_redlock.E011"),
        ({"MAX_TTL": 86400.5}, "django_redlock.E012"),
        ({"MAX_TTL": 0.04}, "django_redlock.E012"),  # too short, before being below the TTL
        ({"TTL": 30, "MAX_TTL": 10}, "django_redlock.E012"),
    ],
)
def test_a_setting_is_refused_in_the_words_of_its_manager_argument(redlock, check_id):
    options = {key.lower(): value for key, value in redlock.items()}
    with pytest.raises((TypeError, ValueError)) as refused:
        LockManager(NODES, **options)
    _, problems = conf.inspect({"NODES": NODES, **redlock})
    errors = [problem for problem in problems if problem.level == "error"]
    spelled = ARGUMENTS.sub(lambda found: conf.setting_name(found[1]), str(refused.value))
    assert [(error.id, error.message) for error in errors] == [(check_id, spelled)]


@pytest.mark.parametrize(
    "redlock",
    [
        {"TTL": 86400, "MAX_TTL": 86400},
        {"TTL": 0.06, "NODE_TIMEOUT": 0.005, "DRIFT_FACTOR": 0.49},
        {"TTL": 120},  # above the default MAX_TTL of 60: that default follows the TTL
        {"DEFAULT_TIMEOUT": None, "KEY_PREFIX": "", "RETRY_DELAY": 0.001, "DRIFT_FACTOR": 0},
    ],
)
def test_a_setting_the_checks_accept_builds_its_manager(redlock):
    parsed, problems = conf.inspect({"NODES": NODES, **redlock})
    assert parsed is not None, problems
    with default_manager.build_manager(parsed) as manager:
        for key, value in redlock.items():
            setting = conf.SETTINGS[[s.key for s in conf.SETTINGS].index(key)]
            assert setting.argument is not None
            assert getattr(manager, setting.argument) == value


def test_each_setting_fills_one_field_and_feeds_one_manager_argument():
    filled = [setting.attribute for setting in conf.SETTINGS]
    fields = {field.name for field in dataclasses.fields(conf.RedlockSettings)} - {"problems"}
    assert sorted(filled) == sorted(fields)
    arguments = [setting.argument for setting in conf.SETTINGS if setting.argument is not None]
    parameters = set(inspect.signature(LockManager).parameters)
    assert len(arguments) == len(set(arguments))
    assert set(arguments) <= parameters


def test_the_settings_reference_page_is_the_table():
    page = (Path(__file__).parents[2] / "docs" / "reference" / "settings.md").read_text()
    assert conf.settings_reference() in page


# -- the observer: wired by the app, not by the settings -------------------------------------


def test_the_app_builds_managers_that_send_signals(settings, cluster3):
    settings.REDLOCK = {"NODES": cluster3.urls, "METRICS_LABEL": "name"}
    manager = get_manager()
    assert isinstance(manager.observer, SignalObserver)
    assert manager.observer.manager is manager
    assert manager.observer.label_mode == "name"


def test_a_thread_holding_many_leases_of_the_apps_manager_has_them_untracked(settings, cluster3):
    """The app's observer keeps no lease and holds its manager weakly, so a thread holding
    many leases has them untracked by the garbage collector while held, as with no observer
    (see core.lease.cycle_free), and tracked again once released."""
    settings.REDLOCK = {"NODES": cluster3.urls}
    manager = get_manager()
    leases = [manager.acquire(f"app-untracked-{i}", ttl=10.0) for i in range(4 * UNTRACK_AT)]
    try:
        assert not any(gc.is_tracked(lease) for lease in leases[UNTRACK_AT:])
    finally:
        for lease in leases:
            lease.release()
    assert all(gc.is_tracked(lease) for lease in leases)


@pytest.mark.usefixtures("redlock_nodes")
def test_a_manager_factory_decides_how_the_manager_is_built(cluster3):
    built = []

    def factory(config: conf.RedlockSettings) -> LockManager:
        built.append(default_manager.build_manager(config))
        return built[-1]

    default_manager.set_manager_factory(factory)
    try:
        assert get_manager() is built[0]
        assert built[0].observer is None
    finally:
        default_manager.set_manager_factory(observed_manager)
    assert get_manager() is not built[0]


def test_the_settings_do_not_reach_into_the_signals():
    tree = ast.parse(Path(conf.__file__).read_text())
    imported = [
        node.module or "" if isinstance(node, ast.ImportFrom) else node.names[0].name
        for node in ast.walk(tree)
        if isinstance(node, ast.Import | ast.ImportFrom)
    ]
    assert not any(module.endswith("signals") for module in imported), imported


def try_busy(manager: LockManager, leases: list[Any]) -> None:
    """Fail to take a held lock while ``leases`` are this frame's: a receiver that keeps the
    error keeps its traceback, which keeps this frame and the leases."""
    held = leases
    with contextlib.suppress(LockContended):
        manager.acquire("busy-0", blocking=False)
    assert held


@pytest.mark.parametrize("keep", ["leases", "errors"])
def test_receivers_that_keep_leases_on_the_sender_leave_a_dropped_manager_collectable(
    cluster3, keep
):
    """A receiver may hang anything on the sender (the manager): leases, or an error whose
    traceback holds the frame that held leases. The observer holds its manager weakly, so no
    lease reaches the manager, and an untracked lease hides no cycle: a manager dropped while
    a thread holds many of its leases is freed by the collector, and those leases with it
    (they then run out by their ttl instead of being renewed for ever)."""

    def keep_lease(sender: Any, lease: Any, **kwargs: Any) -> None:
        sender.__dict__.setdefault("recent", []).append(lease)

    def keep_error(sender: Any, error: Any, **kwargs: Any) -> None:
        sender.last_busy = error

    receiver = keep_lease if keep == "leases" else keep_error
    signal = lock_acquired if keep == "leases" else lock_busy
    signal.connect(receiver)
    gc.collect()
    gc.disable()
    try:
        observer = SignalObserver()
        manager = LockManager(cluster3.urls, observer=observer, ttl=10.0)
        observer.manager = manager
        other = LockManager(cluster3.urls, ttl=10.0)
        taken = other.acquire("busy-0")
        leases = [manager.acquire(f"kept-{i}", auto_extend=True) for i in range(4 * UNTRACK_AT)]
        untracked = sum(not gc.is_tracked(lease) for lease in leases)
        try_busy(manager, leases)
        lease = weakref.ref(leases[-1])
        engine = weakref.ref(manager.engine)
        manager.close()
        del manager, observer, leases
        gc.collect()
        assert untracked >= 3 * UNTRACK_AT
        assert engine() is None
        assert lease() is None
        taken.release()
        other.close()
    finally:
        gc.enable()
        signal.disconnect(receiver)
