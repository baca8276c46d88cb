"""Settings: read lazily, rebuilt on change, every node spelling, passwords kept hidden."""

from __future__ import annotations

import secrets
import sys

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.test import RequestFactory, override_settings
from django.views.debug import ExceptionReporter

from django_redlock import conf, get_manager


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
    # conf.py holds no parsed state until asked: a fresh import leaves it empty.
    conf.reset()
    assert conf._settings is None
    assert conf._manager is None


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
