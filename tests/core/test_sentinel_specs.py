"""A node given as a Sentinel service: its spec (the dict REDLOCK['NODES'] and
``LockManager(nodes=...)`` share), its name, and the replies that send a client back to the
Sentinels (issue 39, item 3). Real Sentinels and failovers: tests/core/test_sentinel.py."""

from __future__ import annotations

from typing import Any

import pytest

from django_redlock import LockManager
from django_redlock.wire.nodes import parse_node
from django_redlock.wire.resp import ReplyError
from django_redlock.wire.setup import is_replica_reply, role_of


def test_malformed_sentinel_specs_are_refused_by_the_manager():
    good = {"SENTINELS": ["redis://127.0.0.1:26379"], "SERVICE": "locks-1"}
    cases: list[tuple[dict[str, Any], type[Exception], str]] = [
        ({"SENTINELS": good["SENTINELS"]}, ValueError, "needs SERVICE"),
        ({**good, "SENTINELS": []}, ValueError, "empty SENTINELS"),
        ({**good, "SENTINELS": "redis://127.0.0.1:26379"}, TypeError, "must be a list"),
        ({**good, "SENTINELS": ["http://127.0.0.1:26379"]}, ValueError, "not a redis://"),
        ({**good, "SENTINELS": ["redis://127.0.0.1:notaport"]}, ValueError, "invalid node URL"),
        ({**good, "SENTINELS": ["redis://:pw@127.0.0.1:26379"]}, ValueError, "names a database"),
        ({**good, "SERVICE_NAME": "x"}, ValueError, "unknown keys: SERVICE_NAME"),
        ({**good, "SSL_OPTIONS": {"cafile": "x"}}, ValueError, "unknown SSL_OPTIONS cafile"),
        ({**good, "TLS": "yes"}, TypeError, "TLS must be True or False"),
        ({**good, "DB": -1}, ValueError, "DB must be an int"),
        (
            {**good, "SENTINELS": [*good["SENTINELS"], "redis://localhost:26379"]},
            ValueError,
            "twice",
        ),
    ]
    for spec, error, words in cases:
        with pytest.raises(error, match=words):
            LockManager([spec])
    with pytest.raises(ValueError, match="listed twice"):
        LockManager([good, {**good, "PASSWORD": "other"}, "redis://127.0.0.1:1"])
    # A password never shows in what the node is called.
    address = parse_node({**good, "PASSWORD": "s3cret", "SENTINEL_PASSWORD": "t0p"})
    assert "s3cret" not in repr(address) + address.label
    assert "t0p" not in repr(address) + address.label


def test_a_sentinel_node_is_named_by_its_sentinels_and_service_whatever_its_master():
    sentinels = ["redis://s1:26379", "rediss://s2:26380"]
    spec: dict[str, Any] = {
        "SENTINELS": sentinels,
        "SERVICE": "locks-1",
        "USERNAME": "locks",
        "DB": 3,
        "TLS": True,
        "SSL_OPTIONS": {"ssl_ca_certs": "/etc/ca.pem"},
    }
    address = parse_node(spec)
    assert address.label == "sentinels://locks@s1:26379,s2:26380/locks-1/3"
    assert (address.host, address.port, address.path) == (None, None, None)
    assert address.ssl_options == (("ssl_ca_certs", "/etc/ca.pem"),)
    assert address.sentinel is not None
    plain, tls = address.sentinel.sentinels
    assert not plain.tls
    assert not plain.ssl_options  # SSL_OPTIONS are for TLS connections only
    assert tls.tls
    assert tls.ssl_options == (("ssl_ca_certs", "/etc/ca.pem"),)  # from SSL_OPTIONS
    # The same service behind the same Sentinels, listed in another order, is one node.
    again = parse_node({**spec, "SENTINELS": list(reversed(sentinels))})
    assert again.identity == address.identity
    assert parse_node({**spec, "SERVICE": "locks-2"}).identity != address.identity


def test_the_role_and_the_replies_that_mean_a_replica():
    assert role_of(b"# Replication\r\nrole:master\r\nconnected_slaves:0\r\n") == "master"
    assert role_of(b"# Replication\r\nrole:slave\r\nmaster_host:h\r\n") == "slave"
    assert role_of(None) == ""
    assert is_replica_reply(ReplyError("READONLY You can't write against a read only replica."))
    assert is_replica_reply(
        ReplyError("QUARANTINED this node is a replica (of 127.0.0.1:7001), not a master: ...")
    )
    assert is_replica_reply(ReplyError("MASTERDOWN Link with MASTER is down"))
    assert not is_replica_reply(ReplyError("QUARANTINED up 3 s, not proven durable"))
    assert not is_replica_reply(ReplyError("QUARANTINED a replica promoted to master ..."))
    assert not is_replica_reply(ReplyError("NOSCRIPT No matching script"))
