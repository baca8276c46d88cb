"""Node addresses: parsing, validation and redaction of the ``nodes`` argument.

A node is given as a URL (``redis://``, ``rediss://``, ``unix://``), as a ready redis-py
client, whose connection settings are copied (never its retry policy), or as a Sentinel
service (a dict, the very one ``REDLOCK['NODES']`` takes: see :func:`parse_sentinel`), whose
master is asked of the Sentinels when a connection opens (:mod:`django_redlock.wire.sentinel`).
Everything shown to a person uses :attr:`NodeAddress.label`, which never contains a password.
"""

from __future__ import annotations

import os
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from urllib.parse import unquote, urlsplit

from redis.connection import parse_url

__all__ = [
    "SENTINEL_KEYS",
    "NodeAddress",
    "SentinelService",
    "parse_node",
    "parse_nodes",
    "parse_sentinel",
    "replica_acks_of",
]

# Spellings of this machine's loopback interface, for duplicate detection.
_LOOPBACK = {"localhost": "127.0.0.1", "localhost.": "127.0.0.1", "::1": "127.0.0.1"}

_CERT_REQS = {
    "none": ssl.CERT_NONE,
    "optional": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}

# Connection settings of a redis-py client that we copy; other TLS settings cannot be honoured
# by our own sockets, so they are refused rather than silently ignored.
_SUPPORTED_CLIENT_KWARGS = frozenset(
    {
        "host",
        "port",
        "path",
        "db",
        "username",
        "password",
        "ssl_keyfile",
        "ssl_certfile",
        "ssl_cert_reqs",
        "ssl_ca_certs",
        "ssl_ca_data",
        "ssl_ca_path",
        "ssl_check_hostname",
        "ssl_password",
        "credential_provider",
    }
)


@dataclass(frozen=True)
class NodeAddress:
    """Where one independent Redis/Valkey master listens, and how to log in.

    Attributes:
        host, port: TCP endpoint (``None`` for a unix socket).
        path: unix socket path (``None`` for TCP).
        db: database number selected after connecting.
        username, password: ACL login; the password is excluded from ``repr``.
        tls: whether to speak TLS (``rediss://``).
        ssl_options: TLS settings copied from the URL query or the client (``ssl_*`` names).
        credential_provider: a redis-py ``CredentialProvider`` asked for the login of every
            new connection (instead of ``username``/``password``); not part of the identity.
        sentinel: for a node reached through Sentinel, the service whose master is the node
            (then ``host``, ``port`` and ``path`` are ``None``: the Sentinels say where it
            is, see :mod:`django_redlock.wire.sentinel`); the login, database and TLS
            settings above are the master's.
        replica_acks: the node setting REPLICA_ACKS (``?replica_acks=N`` in a URL): a grant
            or renewal there counts only once N replicas, and every replica online,
            acknowledged it (:mod:`django_redlock.wire.acks`); 0, the default: not waited
            for. Not part of the node's identity.
    """

    host: str | None = None
    port: int | None = None
    path: str | None = None
    db: int = 0
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    tls: bool = False
    ssl_options: tuple[tuple[str, Any], ...] = field(default=(), repr=False)
    credential_provider: Any = field(default=None, repr=False, compare=False)
    sentinel: SentinelService | None = None
    replica_acks: int = 0

    @property
    def label(self) -> str:
        """A human-readable name for messages and pages, never with the password."""
        user = f"{self.username}@" if self.username else ""
        if self.sentinel is not None:
            # Stable whichever master the Sentinels name now: quarantine records and
            # messages are keyed by it.
            scheme = "sentinels" if self.tls else "sentinel"
            where = ",".join(_endpoint(item) for item in self.sentinel.sentinels)
            return f"{scheme}://{user}{where}/{self.sentinel.service}/{self.db}"
        if self.path is not None:
            where = f"unix://{user}{self.path}"
        else:
            scheme = "rediss" if self.tls else "redis"
            host = f"[{self.host}]" if self.host and ":" in self.host else self.host
            where = f"{scheme}://{user}{host}:{self.port}"
        return f"{where}/{self.db}" if self.path is None else f"{where}?db={self.db}"

    @property
    def identity(self) -> tuple[object, ...]:
        """What makes two addresses the same node (used to refuse duplicates): host names are
        compared without case, and ``localhost`` is the loopback address it names (no DNS is
        asked: ``redlock_status`` finds other duplicates by the servers' run_id)."""
        if self.sentinel is not None:
            # One service behind the same Sentinels is one node, however they are listed.
            sentinels = tuple(sorted(repr(item.identity) for item in self.sentinel.sentinels))
            return ("sentinel", self.sentinel.service, sentinels, self.db)
        host = self.host and self.host.lower()
        host = _LOOPBACK.get(host, host) if host else host
        path = os.path.normpath(self.path) if self.path else self.path
        return (host, self.port, path, self.db)

    def __str__(self) -> str:
        return self.label

    def ssl_context(self) -> ssl.SSLContext:
        """The TLS context for this node (only meaningful when :attr:`tls` is true).

        Raises:
            ValueError: an ``ssl_cert_reqs`` value that is not none/optional/required.
        """
        options = dict(self.ssl_options)
        reqs: Any = options.get("ssl_cert_reqs", "required")
        if isinstance(reqs, str):
            if reqs.lower() not in _CERT_REQS:
                raise ValueError(
                    f"ssl_cert_reqs must be one of none/optional/required, not {reqs!r}"
                )
            reqs = _CERT_REQS[reqs.lower()]
        context = ssl.create_default_context(
            cafile=options.get("ssl_ca_certs"),
            capath=options.get("ssl_ca_path"),
            cadata=options.get("ssl_ca_data"),
        )
        check_hostname = options.get("ssl_check_hostname", True)
        if isinstance(check_hostname, str):
            check_hostname = check_hostname.lower() in ("1", "true", "yes")
        context.check_hostname = bool(check_hostname) and reqs != ssl.CERT_NONE
        context.verify_mode = reqs
        if options.get("ssl_certfile"):
            context.load_cert_chain(
                options["ssl_certfile"],
                options.get("ssl_keyfile"),
                options.get("ssl_password"),
            )
        return context


@dataclass(frozen=True)
class SentinelService:
    """A Redlock node reached through Sentinel: the master of ``service``, as the Sentinels
    tell it. One node is one service; N services (on the same Sentinels or not) for N nodes.

    Attributes:
        service: the name the Sentinels monitor the master under (``sentinel monitor``).
        sentinels: where each Sentinel listens, with its login and TLS settings; asked in
            this order (the one that answered last is asked first next time).
    """

    service: str
    sentinels: tuple[NodeAddress, ...]


SENTINEL_KEYS = frozenset(
    {
        "REPLICA_ACKS",
        "SENTINELS",
        "SERVICE",
        "DB",
        "USERNAME",
        "PASSWORD",
        "SENTINEL_USERNAME",
        "SENTINEL_PASSWORD",
        "TLS",
        "SSL_OPTIONS",
    }
)
"""The keys of a Sentinel node's dict (see :func:`parse_sentinel`)."""

# TLS settings a Sentinel node's SSL_OPTIONS may give (as a rediss:// URL's query may).
_SSL_OPTION_NAMES = frozenset(name for name in _SUPPORTED_CLIENT_KWARGS if name.startswith("ssl_"))


def _endpoint(address: NodeAddress) -> str:
    host = f"[{address.host}]" if address.host and ":" in address.host else address.host
    return f"{host}:{address.port}"


def _optional_text(spec: Mapping[str, Any], key: str) -> str | None:
    value = spec.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TypeError(
            f"nodes: a Sentinel node's {key} must be a string, not {type(value).__name__}"
        )
    return value


def parse_sentinel(spec: Mapping[str, Any]) -> NodeAddress:
    """A node reached through Sentinel, from the dict ``REDLOCK['NODES']`` and
    ``LockManager(nodes=...)`` both take::

        {"SENTINELS": ["redis://s1:26379", "rediss://s2:26379"], "SERVICE": "locks-1",
         "PASSWORD": "...", "SENTINEL_PASSWORD": "...", "DB": 0,
         "TLS": True, "SSL_OPTIONS": {"ssl_ca_certs": "/etc/ssl/ca.pem"}}

    SENTINELS are ``redis://`` or ``rediss://`` URLs (host and port, nothing else but
    ``ssl_*`` options in the query); SERVICE is the monitored name; USERNAME/PASSWORD, DB and
    TLS/SSL_OPTIONS are the master's; SENTINEL_USERNAME/SENTINEL_PASSWORD the Sentinels'
    login (Sentinels often have none, or their own). SSL_OPTIONS (``ssl_*`` names as in a
    rediss:// URL's query) also apply to a rediss:// Sentinel whose URL gives none.

    Raises:
        ValueError: no SERVICE, no Sentinel, a Sentinel URL that does not parse or names a
            path, a database or a login, the same Sentinel twice, an unknown key.
        TypeError: a value of the wrong type.
    """
    unknown = sorted(str(key) for key in spec if key not in SENTINEL_KEYS)
    if unknown:
        raise ValueError(
            f"nodes: a Sentinel node has unknown keys: {', '.join(unknown)} "
            f"(known: {', '.join(sorted(SENTINEL_KEYS))})"
        )
    service = spec.get("SERVICE")
    if not isinstance(service, str) or not service.strip():
        raise ValueError("nodes: a Sentinel node needs SERVICE, the monitored master's name")
    if any(char.isspace() for char in service):
        raise ValueError(f"nodes: Sentinel SERVICE {service!r} contains white space")
    urls = spec.get("SENTINELS")
    if isinstance(urls, str | bytes) or not isinstance(urls, list | tuple):
        raise TypeError("nodes: a Sentinel node's SENTINELS must be a list of redis:// URLs")
    if not urls:
        raise ValueError(f"nodes: Sentinel node {service!r} has an empty SENTINELS list")
    tls = spec.get("TLS", False)
    if not isinstance(tls, bool):
        raise TypeError(f"nodes: a Sentinel node's TLS must be True or False, not {tls!r}")
    ssl_given = spec.get("SSL_OPTIONS") or {}
    if not isinstance(ssl_given, Mapping):
        raise TypeError("nodes: a Sentinel node's SSL_OPTIONS must be a dict of ssl_* names")
    bad = sorted(str(name) for name in ssl_given if name not in _SSL_OPTION_NAMES)
    if bad:
        raise ValueError(
            f"nodes: Sentinel node {service!r}: unknown SSL_OPTIONS {', '.join(bad)} "
            f"(known: {', '.join(sorted(_SSL_OPTION_NAMES))})"
        )
    ssl_options = tuple(sorted((str(k), v) for k, v in ssl_given.items() if v is not None))
    db = spec.get("DB", 0)
    if isinstance(db, bool) or not isinstance(db, int) or db < 0:
        raise ValueError(f"nodes: Sentinel node {service!r}: DB must be an int >= 0, not {db!r}")
    sentinel_username = _optional_text(spec, "SENTINEL_USERNAME")
    sentinel_password = _optional_text(spec, "SENTINEL_PASSWORD")
    sentinels: list[NodeAddress] = []
    for url in urls:
        if not isinstance(url, str):
            raise TypeError(
                f"nodes: Sentinel node {service!r}: each SENTINELS item must be a URL string, "
                f"not {type(url).__name__}"
            )
        parts = urlsplit(url)
        if parts.scheme.lower() not in ("redis", "rediss"):
            raise ValueError(
                f"nodes: Sentinel node {service!r}: {_redact_url(url)!r} is not a redis:// or "
                "rediss:// URL (Sentinels listen on TCP)"
            )
        if parts.path.strip("/") or parts.username or parts.password:
            raise ValueError(
                f"nodes: Sentinel node {service!r}: {_redact_url(url)!r} names a database or a "
                "login; a Sentinel URL is host:port only (use SENTINEL_PASSWORD, DB, PASSWORD)"
            )
        try:
            address = _from_url(url)
        except ValueError as exc:
            text = str(exc).removeprefix("nodes: ")
            raise ValueError(f"nodes: Sentinel node {service!r}: {text}") from None
        if address.tls and not address.ssl_options:
            address = replace(address, ssl_options=ssl_options)
        address = replace(address, username=sentinel_username, password=sentinel_password)
        if any(address.identity == seen.identity for seen in sentinels):
            raise ValueError(
                f"nodes: Sentinel node {service!r} lists the Sentinel {address.label} twice"
            )
        sentinels.append(address)
    return NodeAddress(
        replica_acks=replica_acks_of(spec.get("REPLICA_ACKS", 0), f"Sentinel node {service!r}"),
        db=db,
        username=_optional_text(spec, "USERNAME"),
        password=_optional_text(spec, "PASSWORD"),
        tls=tls,
        ssl_options=ssl_options if tls else (),
        sentinel=SentinelService(service, tuple(sentinels)),
    )


def replica_acks_of(value: object, where: str) -> int:
    """A REPLICA_ACKS value: a whole number of replicas >= 1 (or a string of digits, from a
    URL's query); 0 or None: off.

    Why no "all": a replica whose link is down is not among those a master counts, and may
    still be promoted (redisson #5256); a number the operator states is waited for even then
    (see scripts/node_rule.lua).

    Raises:
        ValueError: anything else, naming the setting and ``where``.
    """
    if value is None or value == 0:
        return 0
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(
            f"nodes: {where}: REPLICA_ACKS must be a whole number of replicas >= 1 (how many "
            f"replicas must acknowledge each grant, at least; every replica online does too), "
            f"not {value!r}"
        )
    return value


def _from_url(url: str) -> NodeAddress:
    parts = urlsplit(url)
    # REPLICA_ACKS in the query (?replica_acks=1) is ours, not a connection setting.
    query = [item for item in parts.query.split("&") if item]
    acks = [item for item in query if item.split("=", 1)[0].lower() == "replica_acks"]
    if acks:
        url = parts._replace(query="&".join(item for item in query if item not in acks)).geturl()
        if len(acks) > 1:
            raise ValueError(f"nodes: node URL {_redact_url(url)!r} names replica_acks twice")
        address = _from_url(url)
        where = f"node URL {address.label}"
        return replace(address, replica_acks=replica_acks_of(acks[0].partition("=")[2], where))
    scheme = parts.scheme.lower()
    if scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            f"nodes: unsupported URL scheme {scheme!r} in {_redact_url(url)!r}; "
            "use redis://, rediss:// or unix://"
        )
    if scheme != "unix":
        # redis-py's parser fills in localhost, 6379 and db 0 for what is missing or wrong;
        # for a lock node that is a silent connection to the wrong server.
        try:
            port = parts.port
        except ValueError as exc:
            raise ValueError(f"nodes: invalid node URL {_redact_url(url)!r}: {exc}") from None
        if not parts.hostname:
            raise ValueError(f"nodes: node URL {_redact_url(url)!r} has no host")
        if port == 0:
            raise ValueError(f"nodes: node URL {_redact_url(url)!r} has port 0")
        database = parts.path.lstrip("/")
        if database and not database.isdigit():
            raise ValueError(
                f"nodes: node URL {_redact_url(url)!r}: the path must be a database number, "
                f"not {database!r}"
            )
    elif not parts.path:
        raise ValueError(f"nodes: node URL {_redact_url(url)!r} has no socket path")
    try:
        kwargs: dict[str, Any] = parse_url(url)  # type: ignore[no-untyped-call]
    except ValueError as exc:
        raise ValueError(f"nodes: invalid node URL {_redact_url(url)!r}: {exc}") from None
    kwargs.pop("connection_class", None)
    database = parts.path.lstrip("/") if scheme != "unix" else ""
    if database and "db" in kwargs and int(database) != kwargs["db"]:
        raise ValueError(
            f"nodes: node URL {_redact_url(url)!r} names two databases "
            f"({database} in the path, {kwargs['db']} in ?db=)"
        )
    address = _from_kwargs(kwargs, tls=scheme == "rediss", source=_redact_url(url))
    if address.path is None and not address.host:
        raise ValueError(f"nodes: node URL {_redact_url(url)!r} has no host")
    return address


def _from_kwargs(kwargs: dict[str, Any], *, tls: bool, source: str) -> NodeAddress:
    ssl_options = tuple(
        sorted((k, v) for k, v in kwargs.items() if k.startswith("ssl_") and v is not None)
    )
    path = kwargs.get("path")
    db = kwargs.get("db") or 0
    try:
        db = int(db)
    except (TypeError, ValueError):
        raise ValueError(f"nodes: database number {db!r} of {source!r} is not an integer") from None
    if path is not None:
        return NodeAddress(
            path=str(path),
            db=db,
            username=kwargs.get("username"),
            password=kwargs.get("password"),
            credential_provider=kwargs.get("credential_provider"),
        )
    return NodeAddress(
        host=str(kwargs.get("host") or "localhost"),
        port=int(kwargs.get("port") or 6379),
        db=db,
        username=kwargs.get("username"),
        password=kwargs.get("password"),
        tls=tls,
        ssl_options=ssl_options,
        credential_provider=kwargs.get("credential_provider"),
    )


def _from_client(client: Any) -> NodeAddress:
    pool = client.connection_pool
    kwargs = dict(pool.connection_kwargs)
    tls = "SSL" in pool.connection_class.__name__
    unsupported = sorted(
        key
        for key, value in kwargs.items()
        if key not in _SUPPORTED_CLIENT_KWARGS
        and key.startswith("ssl_")
        and value not in (None, False, [], "required")
        and not (key == "ssl_check_hostname" and value is True)
    )
    if unsupported:
        raise TypeError(
            "nodes: cannot copy these connection settings from a redis-py client: "
            + ", ".join(unsupported)
            + "; pass a URL instead"
        )
    return _from_kwargs(kwargs, tls=tls, source=repr(pool.connection_class.__name__))


def _redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = unquote(parts.username or "")
    host = parts.netloc.rsplit("@", 1)[1]
    return parts._replace(netloc=f"{user}:***@{host}").geturl()


def parse_node(node: object) -> NodeAddress:
    """One node from a URL string, a redis-py ``Redis`` client or a Sentinel node's dict
    (:func:`parse_sentinel`).

    Raises:
        TypeError: ``node`` is none of these, or the client uses settings our sockets cannot
            honour.
        ValueError: the URL is malformed or has an unsupported scheme; the Sentinel dict is
            malformed.
    """
    if isinstance(node, NodeAddress):
        return node
    if isinstance(node, str):
        return _from_url(node)
    if isinstance(node, Mapping):
        return parse_sentinel(node)
    if hasattr(node, "connection_pool") and hasattr(node.connection_pool, "connection_kwargs"):
        return _from_client(node)
    raise TypeError(
        f"nodes: each node must be a redis://, rediss:// or unix:// URL string, a redis-py "
        f"client or a Sentinel node's dict, not {type(node).__name__}"
    )


def parse_nodes(nodes: object) -> tuple[NodeAddress, ...]:
    """All nodes, validated: at least one, no node twice, no server twice.

    Raises:
        TypeError: ``nodes`` is a single string or not a sequence, or holds a bad item.
        ValueError: empty, a malformed URL, the same node listed twice, or two databases
            of one server (one server is one node, whatever the list says: Django's check
            E005 refuses the same list; an alias only the server's run_id can tell, such as a
            DNS name beside its address, is found at first contact).
    """
    if isinstance(nodes, str | bytes):
        raise TypeError("nodes must be a list of node URLs or clients, not a single string")
    try:
        items = list(nodes)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(
            f"nodes must be a list of node URLs or clients, not {type(nodes).__name__}"
        ) from None
    if not items:
        raise ValueError("nodes must name at least one Redis/Valkey node")
    addresses = tuple(parse_node(item) for item in items)
    seen: dict[tuple[object, ...], NodeAddress] = {}
    servers: dict[tuple[object, ...], NodeAddress] = {}
    for address in addresses:
        identity = address.identity
        if identity in seen:
            raise ValueError(
                f"nodes: {address.label} is listed twice; Redlock needs independent nodes"
            )
        server = identity[:-1]  # the identity without the database
        if server in servers:
            raise ValueError(
                f"nodes: {servers[server].label} and {address.label} are two databases of one "
                "server, not independent nodes; Redlock needs one database of each of 3 or 5 "
                "independent servers"
            )
        seen[identity] = address
        servers[server] = address
    return addresses
