"""A lock node that fails over, for the fault storm (tests/core/test_fault_storm.py, issue 39).

One node as an operator of a replicated Redis runs it: a master and its replica (the same
binary, ``--replicaof``: asynchronous replication), and one address the clients use, a unix
socket path that names whichever process is master now (a symlink; the switch is what a
managed service's DNS name or virtual IP does at a failover). A failover here is the
dangerous one: the replica is made to lag (paused, its link closed on the master, as
``tests/core/test_failover.py`` ``cut_the_link`` does), the master is killed, the replica is
promoted (``REPLICAOF NO ONE``) without what the master wrote since, and the address is
switched to it. The clients' connections to the old master die with it; their next ones reach
the promoted process, which must not vote until every lease its old master may have granted
has run out (``django_redlock/scripts/node_rule.lua``). The old master then comes back as the
new master's replica, so the node can fail over again.

Each process listens on TCP (replication needs a host and port) and on a unix socket of its
own; only the symlink is the node's address.
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import redis

from django_redlock.localnodes import LocalNode
from tests.helpers import node_client


class FailoverNode:
    """A master/replica pair behind one unix socket address.

    The storm's other faults act on the current master (:meth:`pause`, :meth:`resume`,
    :meth:`restart`), as on a plain :class:`~django_redlock.localnodes.LocalNode`.

    Args:
        directory: where sockets, logs and the address go (short: unix socket paths are
            limited to about 100 bytes).
        name: the node's name; its processes are ``<name>a`` and ``<name>b``.
    """

    def __init__(self, directory: Path, name: str) -> None:
        self.address = Path(directory) / f"{name}.sock"
        self.master = self._process(directory, f"{name}a")
        self.replica = self._process(directory, f"{name}b")
        self.master.start()  # declared fresh: a master in service, as cluster5's nodes
        self._point_at(self.master)
        self._start_replica()

    @staticmethod
    def _process(directory: Path, name: str) -> LocalNode:
        node = LocalNode(directory, name=name, tcp=True)
        node.extra_args = _own_socket(node)
        return node

    @property
    def url(self) -> str:
        """The node's URL for the clients: the address, whichever process serves it."""
        return f"unix://{self.address}"

    @property
    def paused(self) -> bool:
        return self.master.paused

    def pause(self) -> None:
        self.master.pause()

    def resume(self) -> None:
        self.master.resume()

    def restart(self) -> None:
        """The master crashes and comes back empty on the same address (its replica then
        full-syncs the empty dataset): the restart rule judges it."""
        self.master.restart()

    def replica_age(self) -> float:
        """Seconds since the replica's process started (time.monotonic)."""
        return time.monotonic() - self._replica_started

    def replica_synced(self) -> bool:
        """The replica is linked to the master and has caught up once (2 s bound)."""
        with contextlib.suppress(redis.RedisError), node_client(self.replica) as client:
            return bool(client.info("replication").get("master_link_status") == "up")
        return False

    def cut_the_link(self) -> None:
        """Pause the replica and close its link on the master: what the master writes from now
        on stays in its backlog, never in the replica's socket, until :meth:`kill_master`
        makes it lost or :meth:`catch_up` lets the replica fetch it."""
        self.replica.pause()
        with node_client(self.master) as client:
            client.execute_command("CLIENT", "KILL", "TYPE", "replica")

    def catch_up(self) -> None:
        """Wake the lagging replica, its master still alive (no failover after all)."""
        self.replica.resume()

    def kill_master(self) -> None:
        """SIGKILL the master (paused or not), then wake the replica: its master is gone, so
        it never gets what it missed. The address still names the dead process (refused)."""
        self.master.kill()
        if self.replica.paused:
            self.replica.resume()

    def promote(self) -> None:
        """``REPLICAOF NO ONE`` on the replica, the address switched to it, and the old
        master started again as its replica (not declared fresh: as a restarted process)."""
        new, old = self.replica, self.master
        with node_client(new) as client:
            client.execute_command("REPLICAOF", "NO", "ONE")
        new.extra_args = _own_socket(new)  # a later restart comes back as a master
        self._point_at(new)
        self.master, self.replica = new, old
        self._start_replica()

    def _start_replica(self) -> None:
        assert self.master.port is not None
        self.replica.extra_args = (
            *_own_socket(self.replica),
            "--replicaof",
            "127.0.0.1",
            str(self.master.port),
        )
        self.replica.start(fresh=False)
        self._replica_started = time.monotonic()

    def _point_at(self, process: LocalNode) -> None:
        # A new symlink renamed over the old one: atomic, so a client connecting meanwhile
        # reaches the old process or the new one, never nothing.
        switch = self.address.with_name(self.address.name + ".new")
        with contextlib.suppress(FileNotFoundError):
            switch.unlink()
        switch.symlink_to(process.socket_path)
        os.replace(switch, self.address)

    def stop(self) -> None:
        self.replica.stop()
        self.master.stop()
        with contextlib.suppress(FileNotFoundError):
            self.address.unlink()

    def __repr__(self) -> str:
        return f"<FailoverNode {self.address} master={self.master!r} replica={self.replica!r}>"


def _own_socket(node: LocalNode) -> tuple[str, ...]:
    """Server arguments for the process's own unix socket (LocalNode gives a TCP node none),
    and a full sync that starts at once (the default waits 5 s for more replicas to join a
    diskless sync: a replica would stay unsynced, so unfit to fail over to, for most of the
    storm)."""
    return (
        "--unixsocket",
        node.socket_path,
        "--unixsocketperm",
        "700",
        "--repl-diskless-sync-delay",
        "0",
    )
