"""TLS: a node whose certificate does not chain to our CA fails fast, and nothing is ever sent
in plaintext instead.

The first test needs no Redis at all: a TLS listener (Python's ``ssl``) records the first
bytes of every connection, so a plaintext fallback would show as a RESP command (``*``)
instead of a TLS ClientHello (``0x16 0x03``). The second runs against a real server when the
configured one was built with TLS (Debian's redis-server is; the bundled Valkey is not).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trustme

from django_redlock import LockManager, QuorumUnreachable
from django_redlock.aredlock import AsyncLockManager
from django_redlock.localnodes import _free_port, server_binary

NODE_TIMEOUT = 0.2


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> dict[str, Path]:
    """A server certificate from one CA, and that CA plus an unrelated one for clients."""
    folder = tmp_path_factory.mktemp("pki")
    ca, other_ca = trustme.CA(), trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = {
        "cert": folder / "server.pem",
        "key": folder / "server.key",
        "ca": folder / "ca.pem",
        "wrong_ca": folder / "wrong-ca.pem",
    }
    cert.cert_chain_pems[0].write_to_path(str(paths["cert"]))
    cert.private_key_pem.write_to_path(str(paths["key"]))
    ca.cert_pem.write_to_path(str(paths["ca"]))
    other_ca.cert_pem.write_to_path(str(paths["wrong_ca"]))
    return paths


@contextlib.contextmanager
def recording_tls_listener(pki: dict[str, Path]) -> Iterator[tuple[int, list[bytes]]]:
    """A TLS server socket on a free port; yields (port, first bytes of each connection)."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(pki["cert"], pki["key"])
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    firsts: list[bytes] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            with conn:
                conn.settimeout(2.0)
                with contextlib.suppress(OSError):
                    firsts.append(conn.recv(5, socket.MSG_PEEK))
                    with context.wrap_socket(conn, server_side=True):
                        pass  # the client refuses our certificate: the handshake fails

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1], firsts
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_wrong_ca_fails_fast_and_never_falls_back_to_plaintext(pki):
    with recording_tls_listener(pki) as (port, firsts):
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={pki['wrong_ca']}"
        manager = LockManager([url], node_timeout=NODE_TIMEOUT)
        for _ in range(3):
            started = time.monotonic()
            with pytest.raises(QuorumUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
                manager.acquire("tls", blocking=False)
            # Bounded by the node timeout (with room for a loaded CI machine), never a hang.
            assert time.monotonic() - started < NODE_TIMEOUT + 1.0
        manager.close()
    assert firsts, "the client never connected"
    assert all(first.startswith(b"\x16\x03") for first in firsts), firsts  # TLS, not RESP


def tls_server_or_skip(pki: dict[str, Path], tmp_path: Path) -> Iterator[int]:
    binary = server_binary()
    port = _free_port()
    process = subprocess.Popen(
        [
            binary,
            *("--port", "0", "--tls-port", str(port), "--save", "", "--dir", str(tmp_path)),
            *("--tls-cert-file", str(pki["cert"]), "--tls-key-file", str(pki["key"])),
            *("--tls-ca-cert-file", str(pki["ca"]), "--tls-auth-clients", "no"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 10
        while True:
            if process.poll() is not None:
                output = process.stdout.read().decode(errors="replace") if process.stdout else ""
                if "TLS" in output:
                    pytest.skip(f"{binary} was built without TLS")
                pytest.fail(f"the TLS server did not start: {output}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
                break
            assert time.monotonic() < deadline, "the TLS server did not listen"
            time.sleep(0.05)
        yield port
    finally:
        process.terminate()
        process.wait(10)
        if process.stdout:
            process.stdout.close()


@pytest.fixture
def tls_port(pki, tmp_path) -> Iterator[int]:
    yield from tls_server_or_skip(pki, tmp_path)


def test_a_real_tls_node_takes_locks_with_the_right_ca_only(pki, tls_port):
    good = LockManager(
        [f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={pki['ca']}"], node_timeout=NODE_TIMEOUT
    )
    good.declare_fresh()  # a brand-new node: no quarantine to sit out
    good.acquire("tls-real", ttl=5.0).release()
    good.close()
    wrong = LockManager(
        [f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={pki['wrong_ca']}"],
        node_timeout=NODE_TIMEOUT,
    )
    with pytest.raises(QuorumUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
        wrong.acquire("tls-real", blocking=False)
    wrong.close()


def test_the_asyncio_core_refuses_a_wrong_ca_and_accepts_the_right_one(pki, tls_port):
    async def main() -> None:
        good = AsyncLockManager(
            [f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={pki['ca']}"],
            node_timeout=NODE_TIMEOUT,
        )
        good.declare_fresh()
        await (await good.acquire("tls-async", ttl=5.0)).release()
        await good.aclose()
        wrong = AsyncLockManager(
            [f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={pki['wrong_ca']}"],
            node_timeout=NODE_TIMEOUT,
        )
        started = time.monotonic()
        with pytest.raises(QuorumUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await wrong.acquire("tls-async", blocking=False)
        assert time.monotonic() - started < NODE_TIMEOUT + 1.0
        await wrong.aclose()

    asyncio.run(main())


def test_the_asyncio_core_never_falls_back_to_plaintext(pki):
    async def main(port: int) -> None:
        url = f"rediss://127.0.0.1:{port}/0?ssl_ca_certs={pki['wrong_ca']}"
        manager = AsyncLockManager([url], node_timeout=NODE_TIMEOUT)
        with pytest.raises(QuorumUnreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await manager.acquire("tls", blocking=False)
        await manager.aclose()

    with recording_tls_listener(pki) as (port, firsts):
        asyncio.run(main(port))
    assert firsts, "the client never connected"
    assert all(first.startswith(b"\x16\x03") for first in firsts), firsts


def slow_ca_bundle(pki: dict[str, Path], folder: Path) -> Path:
    """Our CA among many others, as a system bundle is: a context takes tens to hundreds of
    milliseconds to build from it, far above a node timeout of 50 ms."""
    system = Path(ssl.get_default_verify_paths().cafile or "/etc/ssl/certs/ca-certificates.crt")
    others = system.read_text() if system.exists() else ""
    bundle = folder / "bundle.pem"
    bundle.write_text(others * 10 + pki["ca"].read_text())
    return bundle


def test_the_first_acquire_of_each_thread_on_a_tls_node_succeeds(pki, tls_port, tmp_path):
    # The TLS context is built once per node address, before any deadline: built inside the
    # first command's deadline, every new thread's first try timed out.
    url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={slow_ca_bundle(pki, tmp_path)}"
    manager = LockManager([url])  # the default node timeout: 50 ms
    manager.declare_fresh()
    manager.acquire("tls-warm", ttl=5.0, timeout=5.0).release()
    outcomes: list[object] = []

    def first_try() -> None:
        try:
            manager.acquire("tls-thread", ttl=5.0, blocking=False).release()
            outcomes.append("ok")
        except Exception as exc:
            outcomes.append(exc)

    for _ in range(2):
        thread = threading.Thread(target=first_try)
        thread.start()
        thread.join(10)
    assert outcomes == ["ok", "ok"]
    manager.close()


def test_the_first_asyncio_acquire_on_a_tls_node_succeeds(pki, tls_port, tmp_path):
    url = f"rediss://127.0.0.1:{tls_port}/0?ssl_ca_certs={slow_ca_bundle(pki, tmp_path)}"

    async def main() -> None:
        manager = AsyncLockManager([url])
        manager.declare_fresh()
        await (await manager.acquire("tls-first", ttl=5.0, blocking=False)).release()
        await manager.aclose()

    asyncio.run(main())
