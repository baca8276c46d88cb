"""The names that left ``django_redlock.conf`` for ``django_redlock.default_manager`` still
work from their old path, with a ``DeprecationWarning`` naming the new one (issue 40, item 8:
``set_manager_factory`` and ``build_manager`` had moved with no old path kept)."""

from __future__ import annotations

import re

import pytest

from django_redlock import LockManager, conf, default_manager, get_manager
from django_redlock.signals import observed_manager

MOVED = [
    "ManagerFactory",
    "build_manager",
    "get_async_manager",
    "get_manager",
    "reset",
    "set_manager_factory",
]


def new_path(name: str) -> str:
    return re.escape(f"from django_redlock.default_manager import {name}")


@pytest.mark.parametrize("name", MOVED)
def test_a_moved_name_is_the_new_object_with_a_warning_naming_its_new_path(name):
    with pytest.warns(DeprecationWarning, match=new_path(name)) as caught:
        old = getattr(conf, name)
    assert old is getattr(default_manager, name)
    assert [warning.filename for warning in caught] == [__file__]  # the caller's line


def test_the_old_import_statement_works_too():
    with pytest.warns(DeprecationWarning, match=new_path("set_manager_factory")):
        from django_redlock.conf import set_manager_factory  # type: ignore[attr-defined]
    with pytest.warns(DeprecationWarning, match=new_path("build_manager")):
        from django_redlock.conf import build_manager  # type: ignore[attr-defined]
    assert set_manager_factory is default_manager.set_manager_factory
    assert build_manager is default_manager.build_manager


def test_a_factory_set_through_the_old_path_builds_the_manager(cluster3, settings):
    settings.REDLOCK = {"NODES": cluster3.urls}
    built: list[LockManager] = []

    def factory(config: conf.RedlockSettings) -> LockManager:
        with pytest.warns(DeprecationWarning, match=new_path("build_manager")):
            build = conf.build_manager  # type: ignore[attr-defined]
        built.append(build(config))
        return built[-1]

    with pytest.warns(DeprecationWarning, match=new_path("set_manager_factory")):
        set_factory = conf.set_manager_factory  # type: ignore[attr-defined]
    set_factory(factory)
    try:
        manager = get_manager()
        assert manager is built[0]
        with manager.lock("old-path", ttl=5.0) as lease:
            assert lease.validity > 0
    finally:
        default_manager.set_manager_factory(observed_manager)
    assert get_manager() is not built[0]


def test_any_other_missing_name_is_still_an_attribute_error_without_a_warning():
    with pytest.raises(AttributeError, match=r"'django_redlock\.conf' has no attribute 'nope'"):
        conf.nope  # type: ignore[attr-defined]  # noqa: B018
    assert not hasattr(conf, "get_manager_factory")
    assert "set_manager_factory" not in conf.__all__
