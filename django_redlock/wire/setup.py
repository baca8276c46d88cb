"""Connection set-up, written once for the sync and asyncio transports.

A new connection to a node: resolve every address of its host and try each in turn within the
connect deadline; speak TLS with a context built once per address (outside any deadline); log
in (AUTH with a username, a password or a redis-py ``CredentialProvider``), SELECT the
database, load the hot scripts, and ask the hello (see :class:`Hello`). All of it is pipelined
behind the connect: no round trip of its own. The transports only move these bytes;
:class:`Handshake` takes in the replies, the same way for both.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import ssl
import threading
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from django_redlock.wire.acks import AckState, replicas_online
from django_redlock.wire.errors import NodeError
from django_redlock.wire.nodes import NodeAddress
from django_redlock.wire.resp import ReplyError, encode_command
from django_redlock.wire.scripts import Script

if TYPE_CHECKING:
    from django_redlock.wire.servers import Twins

__all__ = [
    "HELLO_PERSISTENCE",
    "HELLO_RUN_ID",
    "LOGIN",
    "PERSISTENCE",
    "PRELOAD",
    "QUARANTINE",
    "RUN_ID",
    "UNIDENTIFIED",
    "Handshake",
    "Hello",
    "aresolve",
    "describe",
    "hello_quarantine",
    "history_of",
    "identity_of",
    "is_replica_reply",
    "login_commands",
    "persistence_hint",
    "quarantine_of",
    "resolve",
    "role_of",
    "run_id_of",
    "shard_hello",
    "tls_context",
    "warm_tls",
]

# The set-up steps: what a set-up command's reply is for (below zero, where a round's reply
# has its node's index).
LOGIN = -1  # AUTH / SELECT: an error reply makes the connection useless
PRELOAD = -2  # SCRIPT LOAD: an error is tolerated (EVAL still works, e.g. under ACLs)
RUN_ID = -3  # INFO server: which server process this connection reached
PERSISTENCE = -4  # CONFIG GET append*: whether that process is durable
QUARANTINE = -5  # HGET <marker> q: the longest quarantine the node has seen
REPLICATION = -6  # INFO replication: which replication history that process serves
CLUSTER_INFO = -7  # INFO cluster: whether the node is a cluster member
CLUSTER_MAP = -8  # CLUSTER SHARDS: its slot map, if it is one


def _bulk(text: str) -> bytes:
    data = text.encode()
    return b"$%d\r\n%s\r\n" % (len(data), data)


UNIDENTIFIED = _bulk("") + _bulk("")
"""The identity of a connection whose process is not known yet: the run_id and persistence
arguments that a command sent with ``identify=True`` ends with (see ``scripts/acquire.lua``)."""


class Hello:
    """What a new connection asks the node right after its login, pipelined (no round trip).

    Its server process and promotion history (``INFO server``: run_id; ``INFO
    replication``: :func:`history_of`; together ``scripts/node_identity.lua``'s identity) and
    persistence (``CONFIG GET append*``) make the connection's identity, which ends every
    command posted with ``identify=True``; the node's longest quarantine (``HGET <marker>
    q``) goes to ``on_quarantine(node label, ms)`` (0 when the node has none).
    """

    __slots__ = ("marker", "on_quarantine", "on_server", "twins")

    def __init__(
        self,
        marker: str,
        on_quarantine: Callable[[str, int], None],
        on_server: Callable[[str, str], None] | None = None,
        twins: Twins | None = None,
    ) -> None:
        self.marker = marker
        self.on_quarantine = on_quarantine
        self.on_server = on_server
        """Told ``(node label, run_id)`` when a connection learns which server process it
        reached: two labels with one run_id are one server (see wire/servers.py)."""
        self.twins: Twins = {} if twins is None else twins
        """The nodes (by index) whose server an earlier node reached, and that node's index
        and label (``Servers.twins``, kept up to date by ``on_server``): the transports send
        them nothing."""


def shard_hello(hello: Hello | None, tag: str, node: str) -> Hello | None:
    """The hello of a connection to one shard of cluster node ``node`` (its label), whose
    records carry hash ``tag`` (see wire/cluster.py's marker_tag): it reads that shard's
    marker, and reports what it learns under the node's label (the quarantine is the longest
    any shard has seen; two nodes that reach one shard's process are one server)."""
    if hello is None:
        return None
    on_quarantine, on_server = hello.on_quarantine, hello.on_server
    return Hello(
        f"{hello.marker}{{{tag}}}",
        lambda _label, ms: on_quarantine(node, ms),
        None if on_server is None else (lambda _label, run_id: on_server(node, run_id)),
        hello.twins,
    )


HELLO_CLUSTER = encode_command(b"INFO", b"cluster")
HELLO_SHARDS = encode_command(b"CLUSTER", b"SHARDS")
HELLO_RUN_ID = encode_command(b"INFO", b"server")
HELLO_REPLICATION = encode_command(b"INFO", b"replication")
HELLO_PERSISTENCE = encode_command(b"CONFIG", b"GET", b"append*")


def hello_quarantine(marker: str) -> bytes:
    """The hello command that reads the node's longest quarantine (``HGET <marker> q``)."""
    return encode_command(b"HGET", marker, b"q")


def run_id_of(info: object) -> str:
    """The server process's run_id from an ``INFO server`` reply ("" when absent)."""
    text = info.decode(errors="replace") if isinstance(info, bytes) else ""
    start = text.find("run_id:")
    return text[start + 7 : start + 47] if start >= 0 else ""


def history_of(info: object) -> str:
    """A node's promotion history from an ``INFO replication`` reply, as
    ``scripts/node_identity.lua`` spells it: ``<master_replid2>:<second_repl_offset>``
    (``0000...:-1`` for a master never promoted in its process's life; new at every
    promotion). Empty fields when absent."""
    text = info.decode(errors="replace") if isinstance(info, bytes) else ""
    return f"{_field(text, 'master_replid2:')}:{_field(text, 'second_repl_offset:')}"


def _field(text: str, name: str) -> str:
    start = text.find(name)
    if start < 0:
        return ""
    start += len(name)
    end = text.find("\r", start)
    return text[start : end if end >= 0 else len(text)].strip()


def role_of(info: object) -> str:
    """The role (``master``, ``slave``) from an ``INFO replication`` reply ("" when absent)."""
    text = info.decode(errors="replace") if isinstance(info, bytes) else ""
    start = text.find("role:")
    return text[start + 5 :].split("\r", 1)[0].strip() if start >= 0 else ""


# The replies of a node that is a replica now (scripts/node_rule.lua's refusal; a write
# refused; a replica cut from its master with replica-serve-stale-data no).
_REPLICA_REPLIES = ("QUARANTINED this node is a replica", "READONLY", "MASTERDOWN")


def is_replica_reply(reply: object) -> bool:
    """Whether an error ``reply`` says the node is a replica: the transports then drop the
    connection, so the next one reads the node's identity afresh (after a demotion and a
    promotion it is another) and, for a Sentinel node, asks the Sentinels where the master
    is now."""
    return str(reply).startswith(_REPLICA_REPLIES)


def quarantine_of(reply: object) -> int:
    """Milliseconds from an ``HGET <marker> q`` reply; 0 when there is none, or when the node
    refused the read (an ACL without the marker key: it answered all the same)."""
    return int(reply) if isinstance(reply, bytes) and reply.isdigit() else 0


def identity_of(run_id: str, history: str, config: object) -> bytes:
    """The two arguments that complete an ``identify=True`` command on a connection to the
    process ``run_id`` with the promotion ``history`` (:func:`history_of`), whose ``CONFIG
    GET append*`` reply was ``config`` (``scripts/node_identity.lua`` makes the same
    identity)."""
    return _bulk(f"{run_id}/{history}") + _bulk(persistence_hint(config))


def persistence_hint(config: object) -> str:
    """The persistence argument of ``scripts/node_rule.lua`` from a ``CONFIG GET append*``
    reply (a flat name/value list), or from the error that refused it."""
    if not isinstance(config, list):
        return "CONFIG GET refused"
    values = {
        bytes(name).decode(errors="replace"): bytes(value).decode(errors="replace")
        for name, value in zip(config[::2], config[1::2], strict=False)
    }
    if values.get("appendonly") != "yes":
        return "appendonly no"
    fsync = values.get("appendfsync", "unknown")
    return "always" if fsync == "always" else f"appendfsync {fsync}"


def describe(exc: OSError) -> str:
    """A short, lower-case reason for a socket error (no host names, no secrets)."""
    if isinstance(exc, ssl.SSLError):
        return f"TLS error: {exc.reason or exc}"
    if isinstance(exc, socket.gaierror):
        # getaddrinfo's own code (negative), not an errno: os.strerror would say "unknown".
        return str(exc.strerror or "name not resolved").lower()
    if exc.errno is not None:
        return os.strerror(exc.errno).lower()
    return str(exc) or type(exc).__name__


# -- where to connect -----------------------------------------------------------------------

Target = tuple[int, Any]  # (address family, socket address)


def _targets(address: NodeAddress, infos: Sequence[tuple[Any, ...]]) -> list[Target]:
    seen: list[Target] = []
    for family, _, _, _, sockaddr in infos:
        if (family, sockaddr) not in seen:
            seen.append((family, sockaddr))
    if not seen:
        raise NodeError(f"{address.host} resolves to no address")
    return seen


def resolve(address: NodeAddress) -> list[Target]:
    """Every address to try for ``address``, in the resolver's order (one for a unix socket).

    Raises:
        NodeError: the host name does not resolve.
    """
    if address.path is not None:
        return [(socket.AF_UNIX, address.path)]
    try:
        infos = socket.getaddrinfo(address.host, address.port, 0, socket.SOCK_STREAM)
    except OSError as exc:
        raise NodeError(f"cannot resolve {address.host}: {describe(exc)}") from None
    return _targets(address, infos)


async def aresolve(address: NodeAddress) -> list[Target]:
    """:func:`resolve` without blocking the event loop (``loop.getaddrinfo``).

    Raises:
        NodeError: the host name does not resolve.
    """
    if address.path is not None:
        return [(socket.AF_UNIX, address.path)]
    loop = asyncio.get_running_loop()
    try:
        infos = await loop.getaddrinfo(address.host, address.port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise NodeError(f"cannot resolve {address.host}: {describe(exc)}") from None
    return _targets(address, infos)


# -- TLS ------------------------------------------------------------------------------------

# One context per address for the life of the process: building one reads the CA files
# (tens of milliseconds for a system bundle), which must never count against a node timeout
# of a few milliseconds. An SSLContext is safe to share between threads and event loops.
_TLS: dict[NodeAddress, ssl.SSLContext] = {}
_TLS_LOCK = threading.Lock()


def tls_context(address: NodeAddress) -> ssl.SSLContext:
    """The TLS context for ``address`` (built on first use, then shared).

    Raises:
        NodeError: the TLS settings are unusable (a missing file, a bad ``ssl_cert_reqs``);
            not cached, so a file that appears later is read then.
    """
    context = _TLS.get(address)
    if context is not None:
        return context
    with _TLS_LOCK:
        context = _TLS.get(address)
        if context is None:
            try:
                context = address.ssl_context()
            except (OSError, ValueError) as exc:
                raise NodeError(f"TLS set-up failed: {exc}") from None
            _TLS[address] = context
    return context


def warm_tls(addresses: Sequence[NodeAddress]) -> None:
    """Build the TLS contexts of ``addresses`` now, before any deadline runs. A failure is
    left for the connection that needs the context to report."""
    for address in addresses:
        # A Sentinel node's Sentinels too: they are asked within the node timeout.
        sentinels = address.sentinel.sentinels if address.sentinel is not None else ()
        for item in (address, *sentinels):
            if item.tls:
                with contextlib.suppress(NodeError):
                    tls_context(item)


# -- what a new connection sends first --------------------------------------------------------


def login_commands(address: NodeAddress) -> list[bytes]:
    """AUTH (when the node wants a login) and SELECT (when the database is not 0).

    The credentials come from ``address.credential_provider`` (redis-py's
    ``CredentialProvider``: ``(password,)`` or ``(username, password)``) when there is one,
    asked afresh for every connection (tokens expire), else from the URL.

    Raises:
        NodeError: the credential provider failed (its message is not repeated: it may
            hold a secret).
    """
    commands = []
    username, password = address.username, address.password
    provider = address.credential_provider
    if provider is not None:
        try:
            credentials = tuple(provider.get_credentials())
        except Exception as exc:
            raise NodeError(f"credential provider failed: {type(exc).__name__}") from None
        if len(credentials) == 1:
            username, password = None, credentials[0]
        else:
            username, password = credentials[0], credentials[1]
    if password is not None:
        login: tuple[bytes | str, ...] = (password,)
        if username:
            login = (username, password)
        commands.append(encode_command(b"AUTH", *login))
    if address.db:
        commands.append(encode_command(b"SELECT", address.db))
    return commands


class Handshake:
    """What one connection learns from its set-up replies; a base of both transports'
    connection classes, so that the set-up is written once.

    Holds the connection's identity (see :class:`Hello`) and, until it is known, the
    commands that need it. :meth:`setup_commands` lists what to send first;
    :meth:`learn` takes in each set-up reply; :meth:`outgoing` turns a command into the
    bytes to write now.
    """

    def __init__(
        self,
        address: NodeAddress,
        hello: Hello | None,
        preload: Sequence[Script] = (),
        classify: bool = False,
        expect_cluster: bool = False,
    ) -> None:
        self.address = address
        self.hello = hello
        self.preload = tuple(preload)
        # The run_id and persistence arguments for `identify=True` commands (see Hello), and
        # the commands held until they are known (None: not holding), each with whether the
        # identity completes it.
        self.identity = UNIDENTIFIED
        # A node with REPLICA_ACKS: what its grants and renewals are followed by (wire/acks.py).
        self.acks = AckState(address.replica_acks) if address.replica_acks else None
        self.run_id = ""
        self.history = ""
        # Whether the server this connection reached is plain or a cluster member is a fact
        # about its process, not its address (an endpoint may be switched between the two,
        # or a port re-used, while clients run): with `classify`, the connection asks (INFO
        # cluster, CLUSTER SHARDS, pipelined behind the login: no round trip of its own) and
        # holds every command until the answer, so that a lock's keys never leave in a form
        # the server's mode does not take (wire/cluster_route.py). `expect_cluster`: the
        # mode the transport uses the node in (a shard connection's: a cluster member).
        # When the answer differs (`switched`), what was held stays held, for the transport
        # to send in the right form (take_held). `cluster_shards`: a cluster member's
        # CLUSTER SHARDS reply (its slot map, for the transport). A node with REPLICA_ACKS
        # asks too, without holding (its grants go at once, with their WAIT), and a
        # cluster's answer refuses the connection (REPLICA_ACKS is not supported there).
        self.asks_mode = classify
        self.classifying = classify and not address.replica_acks
        self.expect_cluster = expect_cluster
        self.switched = False
        self.cluster_enabled = False
        self.cluster_shards: object = None
        holding = hello is not None or self.classifying
        self.held: list[tuple[bytes, bool]] | None = [] if holding else None
        self.loads_owed = 0  # SCRIPT LOAD replies still owed
        # The node answered as a replica (its hello, or a refusal): for a Sentinel node, the
        # Sentinel that named it is asked last next time (see wire/sentinel.py's forget).
        self.met_replica = False
        # For a Sentinel node: the failovers its process had heard of when this connection
        # was opened (wire/sentinel.py's Watch); one heard since makes the transport drop it.
        self.switches = 0

    def setup_commands(self) -> list[tuple[bytes, int]]:
        """The commands a new connection starts with, each with the set-up step its reply is for.

        Raises:
            NodeError: the credential provider failed.
        """
        commands = [(command, LOGIN) for command in login_commands(self.address)]
        if self.asks_mode:
            commands += [(HELLO_CLUSTER, CLUSTER_INFO), (HELLO_SHARDS, CLUSTER_MAP)]
        # Load the scripts first, so EVALSHA does not meet NOSCRIPT in normal operation: a
        # NOSCRIPT fallback is re-sent behind whatever was pipelined meanwhile, out of order.
        commands += self.reload_commands()
        hello = self.hello
        if hello is not None:
            commands.append((HELLO_RUN_ID, RUN_ID))
            commands.append((HELLO_REPLICATION, REPLICATION))
            commands.append((HELLO_PERSISTENCE, PERSISTENCE))
            commands.append((hello_quarantine(hello.marker), QUARANTINE))
        return commands

    def reload_commands(self) -> list[tuple[bytes, int]]:
        """SCRIPT LOAD of every preloaded script, unless a load is already on its way.

        Sent again when a node answers NOSCRIPT (after ``SCRIPT FLUSH``, a restart, a
        failover): the EVAL fallback runs the one script, and the others would each meet
        NOSCRIPT once more on their next use.
        """
        if self.loads_owed:
            return []
        self.loads_owed = len(self.preload)
        return [
            (encode_command(b"SCRIPT", b"LOAD", script.source), PRELOAD) for script in self.preload
        ]

    def learn(self, step: int, reply: object) -> bytes:
        """Take in the reply to a set-up command of ``step``; returns the bytes that may go
        out now (the commands held until the identity was known), often none.

        Raises:
            NodeError: the login (AUTH or SELECT) was refused, or a Sentinel node's
                connection reached a replica: the connection is useless.
        """
        if isinstance(reply, NodeError):  # the connection failed: nothing to learn
            return b""
        if step == LOGIN:
            if isinstance(reply, ReplyError):
                raise NodeError(f"login refused: {reply}")
        elif step == PRELOAD:
            self.loads_owed = max(0, self.loads_owed - 1)
        elif step == RUN_ID:
            self.run_id = run_id_of(reply)
            if self.hello is not None and self.hello.on_server is not None and self.run_id:
                self.hello.on_server(self.address.label, self.run_id)
        elif step == REPLICATION:
            self.history = history_of(reply)
            if self.acks is not None:
                self.acks.saw_online(replicas_online(reply))
            if self.address.sentinel is not None and isinstance(reply, bytes):
                role = role_of(reply)
                if role != "master":
                    self.met_replica = True
                    # A Sentinel that has not seen the failover yet, or a demoted master:
                    # this connection is useless (the transport drops it, and forgets the
                    # Sentinels' answer); what it held never went out.
                    raise NodeError(
                        f"the Sentinels' master of service {self.address.sentinel.service!r} "
                        f"is a {role or 'non-master'} now; asking the Sentinels again"
                    )
        elif step == PERSISTENCE:
            # The identity is complete (INFO came first on this connection): from now on the
            # node can take the acquire hot path for this connection. The commands held
            # meanwhile go out now, in order, after the replies that preceded them (unless
            # the node is a cluster: the transport sends them to its shards).
            self.identity = identity_of(self.run_id, self.history, reply)
            if self.classifying or self.switched:
                return b""
            return self._release()
        elif step == CLUSTER_INFO:
            self.cluster_enabled = isinstance(reply, bytes) and b"cluster_enabled:1" in reply
        elif step == CLUSTER_MAP:
            self.classifying = False
            # A map is a cluster's answer whatever INFO said (an ACL without +info); a plain
            # node refuses the command.
            cluster = self.cluster_enabled or isinstance(reply, list)
            if cluster:
                if self.address.replica_acks:
                    raise NodeError(
                        "the node is a cluster member, and REPLICA_ACKS is not supported on "
                        "cluster nodes: remove REPLICA_ACKS from this node's settings"
                    )
                # An error reply too (no CLUSTER SHARDS before Redis 7): the transport reads
                # CLUSTER SLOTS then.
                self.cluster_shards = reply
            if cluster != self.expect_cluster:
                self.switched = True  # what was held waits for the transport (take_held)
                return b""
            if self.hello is None or self.identity is not UNIDENTIFIED:
                return self._release()
        elif step == QUARANTINE and self.hello is not None:
            self.hello.on_quarantine(self.address.label, quarantine_of(reply))
        return b""

    def acked(self, command: bytes, identify: bool, timeout_ms: int) -> bytes:
        """The bytes to write for a grant or renewal ``command`` to a node with REPLICA_ACKS:
        the command completed with the identity (when ``identify``) and this client's
        REPLICA_ACKS, then its WAIT (wire/acks.py). Never held: before the hello is answered
        it goes at once, in order behind what was held, with the identity left blank (the
        node then checks its own process)."""
        assert self.acks is not None
        held = self.held
        if held is None:
            return self.acks.command(command, self.identity if identify else b"", timeout_ms)
        before = self.outgoing(b"", False)
        return before + self.acks.command(command, UNIDENTIFIED if identify else b"", timeout_ms)

    def outgoing(self, command: bytes, identify: bool) -> bytes:
        """The bytes to write for ``command`` now (empty: held until the identity is known).

        With ``identify`` the connection's identity completes the command. A command that
        names nothing is never held: what is held goes out first, unidentified, so the node
        applies everything in order (a failed acquire's clean-up release must follow its SET).
        """
        held = self.held
        if held is None:
            return command + self.identity if identify else command
        if identify or self.classifying or self.switched:
            held.append((command, identify))
            return b""
        if held:
            command = (
                b"".join(item + UNIDENTIFIED if ident else item for item, ident in held) + command
            )
            held.clear()
        return command

    def _release(self) -> bytes:
        """What was held, to write now (the identity completing what it should); nothing is
        held from now on."""
        held, self.held = self.held or [], None
        return b"".join(command + self.identity if ident else command for command, ident in held)

    def take_held(self) -> list[tuple[bytes, bool]]:
        """The commands held on a connection whose server turned out to be in the other mode
        (:attr:`switched`), for the transport to send in the right form (each with whether
        the identity completes it); the connection holds nothing from now on."""
        held, self.held = self.held or [], []
        return held
