"""A node reached through Sentinel in ``REDLOCK['NODES']`` (issue 39, item 3): the system
check of a malformed spec (E014), the manager it builds, and what operators see of it
(``redlock_status`` text and JSON, the admin page) with a real Sentinel."""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.core.management import call_command
from django.test import Client
from django.urls import reverse

from django_redlock import get_manager
from django_redlock.checks import check_settings
from django_redlock.localnodes import LocalNode, LocalSentinel
from django_redlock.wire import sentinel as sentinel_cache

GOOD: dict[str, Any] = {"SENTINELS": ["redis://127.0.0.1:26379"], "SERVICE": "locks-1"}
PAGE = "admin:django_redlock_activelock_changelist"


@pytest.mark.parametrize(
    ("spec", "words"),
    [
        ({"SENTINELS": GOOD["SENTINELS"]}, "needs SERVICE"),
        ({"SERVICE": "locks-1"}, "SENTINELS must be a list"),
        ({**GOOD, "SENTINELS": []}, "empty SENTINELS list"),
        ({**GOOD, "SENTINELS": ["redis://127.0.0.1:port"]}, "invalid node URL"),
        ({**GOOD, "SENTINELS": ["unix:///tmp/s.sock"]}, "is not a redis:// or rediss:// URL"),
        ({**GOOD, "SENTINELS": ["redis://127.0.0.1:26379/2"]}, "names a database or a login"),
        ({**GOOD, "MASTER": "x"}, "unknown keys: MASTER"),
        ({**GOOD, "SERVICE": "locks 1"}, "contains white space"),
    ],
    ids=["no-service", "no-sentinels", "empty", "bad-url", "unix", "db", "unknown", "space"],
)
def test_a_malformed_sentinel_node_is_e014_naming_the_setting(settings, spec, words):
    settings.REDLOCK = {"NODES": [spec, "redis://127.0.0.1:1", "redis://127.0.0.1:2"]}
    messages = [m for m in check_settings() if m.id == "django_redlock.E014"]
    assert len(messages) == 1, [m.id for m in check_settings()]
    assert messages[0].msg.startswith("REDLOCK['NODES']: ")
    assert words in messages[0].msg, messages[0].msg
    assert messages[0].hint is not None
    assert messages[0].hint.endswith("#django_redlocke014")
    with pytest.raises(ImproperlyConfigured, match="Sentinel"):
        get_manager()


def test_a_good_sentinel_node_passes_the_checks_and_hides_its_passwords(settings):
    spec = {**GOOD, "PASSWORD": "m4ster", "SENTINEL_PASSWORD": "s3ntinel", "DB": 2}
    settings.REDLOCK = {"NODES": [spec, "redis://127.0.0.1:1", "redis://127.0.0.1:2"]}
    assert [m.id for m in check_settings() if m.level >= 40] == []
    (address, *_) = get_manager().addresses
    assert address.sentinel is not None
    assert address.sentinel.service == "locks-1"
    assert (address.password, address.db) == ("m4ster", 2)
    assert address.sentinel.sentinels[0].password == "s3ntinel"
    assert address.label == "sentinel://127.0.0.1:26379/locks-1/2"
    assert "m4ster" not in repr(address)
    assert "s3ntinel" not in repr(address)


def test_the_same_service_twice_is_e005(settings):
    settings.REDLOCK = {"NODES": [GOOD, {**GOOD, "PASSWORD": "x"}, "redis://127.0.0.1:1"]}
    assert "django_redlock.E005" in [m.id for m in check_settings()]


@contextlib.contextmanager
def _serving() -> Iterator[tuple[LocalNode, LocalSentinel]]:
    """A master on TCP and a Sentinel watching it as ``locks-1``."""
    directory = Path(tempfile.mkdtemp(prefix="rl-sd-", dir="/tmp"))
    master = LocalNode(directory, name="m", tcp=True)
    sentinel = LocalSentinel(directory, {"locks-1": master}, name="s")
    try:
        master.start()
        sentinel.start()
        yield master, sentinel
    finally:
        sentinel.stop()
        master.stop()
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture
def sentinel_node(settings, redlock_nodes) -> Iterator[tuple[LocalNode, LocalSentinel]]:
    """REDLOCK with a Sentinel node (a real Sentinel watching a real master) and two of the
    session's plain nodes."""
    with _serving() as (master, sentinel):
        with socket.socket() as probe:  # a Sentinel that is down, listed first
            probe.bind(("127.0.0.1", 0))
            dead = f"redis://127.0.0.1:{probe.getsockname()[1]}"
        spec = {"SENTINELS": [dead, sentinel.url], "SERVICE": "locks-1"}
        settings.REDLOCK = {"NODES": [spec, *redlock_nodes.urls[:2]], "RETRY_DELAY": 0.01}
        yield master, sentinel


@pytest.mark.slow
def test_operators_see_the_service_and_the_master_it_resolved_to(
    sentinel_node, admin_client: Client
):
    master, _ = sentinel_node
    lease = get_manager().acquire("report", ttl=30.0)
    try:
        out = io.StringIO()
        call_command("redlock_status", "--json", stdout=out)
        node = json.loads(out.getvalue())["nodes"][0]
        assert node["service"] == "locks-1"
        assert node["resolved"] == f"127.0.0.1:{master.port}"
        assert node["votes"] is True
        assert node["node"].startswith("sentinel://127.0.0.1:")
        assert node["node"].endswith("/locks-1/0")

        out = io.StringIO()
        call_command("redlock_status", stdout=out)
        assert f"sentinel service locks-1: master 127.0.0.1:{master.port}" in out.getvalue()

        page = admin_client.get(reverse(PAGE)).content.decode()
        assert "Sentinel service <code>locks-1</code>" in page
        assert f"master <code>127.0.0.1:{master.port}</code>" in page
    finally:
        lease.release()


@pytest.mark.slow
def test_a_sentinel_node_whose_sentinels_are_down_is_down_not_misconfigured(sentinel_node):
    _, sentinel = sentinel_node
    sentinel.stop()
    sentinel_cache.forget(get_manager().addresses[0])  # as a connection loss would
    out = io.StringIO()
    call_command("redlock_status", "--json", stdout=out)
    node = json.loads(out.getvalue())["nodes"][0]
    assert node["reachable"] is False
    assert node["misconfigured"] is False
    assert node["resolved"] is None
    assert "no Sentinel told the master of service 'locks-1'" in node["problems"][0]
