"""Bad arguments fail before any network I/O, with a message naming the argument."""

from __future__ import annotations

import math

import pytest

from django_redlock import LockManager
from django_redlock.procedures.arguments import (
    _CONTROL_CHARACTERS,
    DEFAULT_MAX_TTL,
    MAX_NAME_BYTES,
    MAX_TTL,
    check_max_ttl,
    check_ttl,
    validate_name,
)

# Nothing listens here: every check below must fail before a connection is tried.
NODES = ["redis://127.0.0.1:1/0", "redis://127.0.0.1:2/0", "redis://127.0.0.1:3/0"]


@pytest.fixture
def manager() -> LockManager:
    return LockManager(NODES)


@pytest.mark.parametrize(
    ("name", "error", "match"),
    [
        ("", ValueError, "must not be empty"),
        (None, TypeError, "name must be a str, not NoneType"),
        (42, TypeError, "name must be a str, not int"),
        (b"bytes", TypeError, "name must be a str, not bytes"),
        ("x" * (MAX_NAME_BYTES + 1), ValueError, "limit is 1024"),
        ("é" * (MAX_NAME_BYTES // 2 + 1), ValueError, "limit is 1024"),
        ("line\nbreak", ValueError, "control characters"),
        ("nul\x00", ValueError, "control characters"),
    ],
)
def test_bad_names(manager, name, error, match):
    with pytest.raises(error, match=match):
        manager.acquire(name)


def test_the_ascii_shortcut_refuses_exactly_the_control_characters():
    # validate_name judges an ASCII name by str.isprintable instead of the regex: for every
    # ASCII character, alone and inside a name, both must say the same.
    for code in range(128):
        character = chr(code)
        control = _CONTROL_CHARACTERS.search(character) is not None
        assert character.isprintable() is not control, hex(code)
        for name in (character, f"job:{character}:1"):
            if control:
                with pytest.raises(ValueError, match="control characters"):
                    validate_name(name)
            else:
                assert validate_name(name) == name
    # Outside ASCII the regex still decides (C1 controls; a printable character passes).
    with pytest.raises(ValueError, match="control characters"):
        validate_name("caf\u00e9\x85")
    assert validate_name("caf\u00e9 \u00a0x") == "caf\u00e9 \u00a0x"


def test_names_are_nfc_normalised():
    assert validate_name("U\u0308ber") == "\u00dcber"  # decomposed and composed: one lock
    assert validate_name("job*?[x]") == "job*?[x]"  # glob characters are just characters


@pytest.mark.parametrize(
    ("ttl", "error", "match"),
    [
        (0, ValueError, "ttl must be more than zero"),
        (-1.5, ValueError, "ttl must be more than zero"),
        (math.nan, ValueError, "finite"),
        (math.inf, ValueError, "finite"),
        (True, TypeError, "ttl must be a number of seconds, not bool"),
        ("30", TypeError, "not str"),
        (86400.5, ValueError, "above the cap of 86400 seconds"),
        (0.04, ValueError, "too short"),
    ],
)
def test_bad_ttls(manager, ttl, error, match):
    with pytest.raises(error, match=match):
        manager.acquire("name", ttl=ttl)
    with pytest.raises(error, match=match):
        LockManager(NODES, ttl=ttl)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"timeout": -1}, ValueError, "timeout must be zero or more"),
        ({"timeout": "1"}, TypeError, "timeout must be a number"),
        ({"blocking": False, "timeout": 2.0}, ValueError, "blocking=False"),
        ({"blocking": "yes"}, TypeError, "blocking must be a bool"),
        ({"origin": 3}, TypeError, "origin must be a str"),
    ],
)
def test_bad_acquire_options(manager, options, error, match):
    with pytest.raises(error, match=match):
        manager.acquire("name", **options)


@pytest.mark.parametrize(
    ("nodes", "error", "match"),
    [
        ([], ValueError, "at least one"),
        ("redis://127.0.0.1:1/0", TypeError, "not a single string"),
        (None, TypeError, "not NoneType"),
        ([42], TypeError, "not int"),
        (["http://127.0.0.1:1"], ValueError, "unsupported URL scheme 'http'"),
        (["redis://a:1/0", "redis://A:1/0"], ValueError, "listed twice"),
        (["redis://:pw@a:1/0", "redis://a:1/0"], ValueError, "listed twice"),
        (["unix:///tmp/x.sock", "unix:///tmp/x.sock?db=0"], ValueError, "listed twice"),
        (["redis://localhost:1/0", "redis://127.0.0.1:1/0"], ValueError, "listed twice"),
        (["redis://127.0.0.1:0/0"], ValueError, "has port 0"),
        (["redis://127.0.0.1:70000/0"], ValueError, "Port out of range"),
        (["redis://:6379/0"], ValueError, "has no host"),
        (["redis:///0"], ValueError, "has no host"),
        (["redis://h:abc/0"], ValueError, "invalid node URL"),
        (["redis://h:1/zero"], ValueError, "must be a database number, not 'zero'"),
    ],
)
def test_bad_node_lists(nodes, error, match):
    with pytest.raises(error, match=match):
        LockManager(nodes)


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"node_timeout": 0}, ValueError, "node_timeout must be more than zero"),
        ({"retry_delay": -1}, ValueError, "retry_delay"),
        ({"drift_factor": 0.5}, ValueError, "drift_factor must be below 0.5"),
        ({"drift_factor": -0.1}, ValueError, "drift_factor must be zero or more"),
        ({"key_prefix": b"x"}, TypeError, "key_prefix must be a str"),
        ({"ttl": 1.0, "node_timeout": 1.0}, ValueError, "too short"),
    ],
)
def test_bad_manager_options(options, error, match):
    with pytest.raises(error, match=match):
        LockManager(NODES, **options)


def test_passwords_never_appear_in_errors_or_reprs():
    with pytest.raises(ValueError) as info:
        LockManager(["redis://:hunter2@a:1/0", "redis://:hunter2@a:1/0"])
    assert "hunter2" not in str(info.value)
    manager = LockManager(["redis://user:hunter2@a:1/0"])
    assert "hunter2" not in repr(manager)
    assert "hunter2" not in repr(manager.addresses[0])
    assert manager.nodes == ("redis://user@a:1/0",)
    with pytest.raises(ValueError) as bad_scheme:
        LockManager(["http://user:hunter2@a:1/0"])
    assert "hunter2" not in str(bad_scheme.value)


def test_the_ttl_check_names_the_other_arguments_as_told():
    with pytest.raises(ValueError, match=r"^TTL=0\.04 is too short: with NODE_TIMEOUT=0\.05 "):
        check_ttl(0.04, "TTL", node_timeout=0.05, spell=str.upper)
    with pytest.raises(
        ValueError, match=r"^TTL=90 is above MAX_TTL=60, the restart quarantine: raise MAX_TTL to "
    ):
        check_ttl(90, "TTL", max_ttl=60.0, spell=str.upper)
    assert check_ttl(MAX_TTL) == MAX_TTL
    # Told nothing (an acquire's ttl), it names the Django setting beside the argument.
    with pytest.raises(ValueError, match=r"raise max_ttl \(REDLOCK\['MAX_TTL'\] in Django\)"):
        check_ttl(90, max_ttl=60.0)


def test_max_ttl_defaults_to_a_minute_or_the_ttl_when_longer():
    assert check_max_ttl(None, 30.0) == DEFAULT_MAX_TTL == 60.0
    assert check_max_ttl(None, 90.0) == 90.0
    with pytest.raises(ValueError, match=r"^ttl=90 is above max_ttl=60$"):
        check_max_ttl(60, 90.0)
