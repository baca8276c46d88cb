"""An EVAL sent in place of an EVALSHA (the node answered NOSCRIPT: a SCRIPT FLUSH, or a
failover or restart a proxy hid from the connection) carries no identity of the server
process. It must meet the node rule, never the hot path: the marker's ``run`` is cleared to
'' when a promoted replica is first seen or a process is refused, and an empty identity
matched it, so a node in quarantine granted the lock (found by the simulator: seed
800431576, profile failovers, a SCRIPT FLUSH on a promoted replica). Real nodes, the exact
EVAL the transport sends (the command's fallback).
"""

from __future__ import annotations

import secrets

import pytest
import redis

from django_redlock.core.owner import owner_id
from django_redlock.localnodes import LocalCluster
from django_redlock.wire.primitives import semaphore_acquire_command
from django_redlock.wire.scripts import NODE_KEY, acquire_command
from tests.helpers import node_client

QUARANTINE_MS = 60_000
RECORD = '{"host":"test","pid":1,"acquired_at":'
OWNER = f"{owner_id(RECORD)}rs {RECORD}"  # as OwnerRecords.record makes it


@pytest.fixture
def quarantined_node():
    """A node just started, not declared: its marker's run cleared to '' as node_rule.lua
    leaves it, with the quarantine the EVAL sends; it may not vote for 60 s."""
    with LocalCluster(1, fresh=False) as cluster:
        with node_client(cluster[0]) as client:
            client.hset(NODE_KEY, mapping={"run": "", "q": str(QUARANTINE_MS)})
        yield cluster[0]


def send_fallback(node, command) -> object:
    """The command's NOSCRIPT fallback, the EVAL as the transport writes it, on a raw
    connection: its reply (an error reply as its exception). An identified fallback is
    completed as a connection that has not read the node's identity yet completes it: with
    '' for the identity and the persistence."""
    _, fallback = command
    data = fallback.build()
    if fallback.identify:
        data += b"$0\r\n\r\n$0\r\n\r\n"
    with node_client(node) as client:
        connection = client.connection_pool.get_connection()
        try:
            connection.send_packed_command([data])
            try:
                return connection.read_response()
            except redis.ResponseError as error:
                return error
        finally:
            client.connection_pool.release(connection)


def test_an_acquires_eval_on_a_quarantined_node_is_refused(quarantined_node):
    token = secrets.token_hex(20)
    command = acquire_command("redlock:eval", token, 10_000, OWNER, QUARANTINE_MS)
    reply = send_fallback(quarantined_node, command)
    assert isinstance(reply, redis.ResponseError), reply
    assert str(reply).startswith("QUARANTINED")
    with node_client(quarantined_node) as client:
        assert client.exists("redlock:eval") == 0


def test_a_semaphores_eval_on_a_quarantined_node_is_refused(quarantined_node):
    token = secrets.token_hex(20)
    command = semaphore_acquire_command("redlock:sem", 2, token, 10_000, OWNER, QUARANTINE_MS)
    reply = send_fallback(quarantined_node, command)
    assert isinstance(reply, redis.ResponseError), reply
    assert str(reply).startswith("QUARANTINED")
