"""The RESP2 wire format: command encoding and an incremental reply reader.

The hot path (acquire/release/extend) writes pre-encoded commands to every node's socket and
parses the replies itself, because redis-py's command layer costs more per command than the
loopback round trip it wraps (issue 2 measured ~27 µs of overhead against ~20 µs of network).
``hiredis`` is used for parsing when installed; the pure-Python reader below is the fallback
and behaves the same (same reply types, errors as ``ReplyError`` instances, not raised).
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = [
    "BAD_REPLY",
    "PROTOCOL_ERRORS",
    "Reader",
    "ReplyError",
    "encode_command",
    "encode_parts",
    "make_reader",
]


class ReplyError(Exception):
    """An error reply from the server (``-ERR ...``), returned by the reader, never raised."""


class Reader(Protocol):
    """What the connection needs from a reply reader (hiredis.Reader satisfies it)."""

    def feed(self, data: bytes, /) -> None: ...

    def gets(self) -> Any: ...


def encode_command(*parts: bytes | str | int) -> bytes:
    """Encode one command as a RESP array of bulk strings.

    ``str`` parts are UTF-8 encoded, ``int`` parts written in decimal.
    """
    return b"*%d\r\n" % len(parts) + encode_parts(parts)


def encode_parts(parts: tuple[bytes | str | int, ...] | list[bytes | str | int]) -> bytes:
    """The bulk strings of ``parts``, without the array header (for pre-encoded prefixes)."""
    out = []
    for part in parts:
        data = part if type(part) is bytes else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(out)


_INCOMPLETE = object()


class PythonReader:
    """Incremental RESP2 reader with hiredis.Reader's interface: ``feed()`` then ``gets()``.

    ``gets()`` returns the next complete reply, or ``False`` when more bytes are needed.
    Status replies come back as ``bytes`` (like hiredis), error replies as ``ReplyError``.
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._pos = 0

    def feed(self, data: bytes, /) -> None:
        if self._pos:
            del self._buffer[: self._pos]
            self._pos = 0
        self._buffer += data

    def gets(self) -> Any:
        start = self._pos
        value = self._parse()
        if value is _INCOMPLETE:
            self._pos = start
            return False
        return value

    def _line(self) -> bytes | None:
        end = self._buffer.find(b"\r\n", self._pos)
        if end < 0:
            return None
        line = bytes(self._buffer[self._pos : end])
        self._pos = end + 2
        return line

    def _parse(self) -> Any:
        line = self._line()
        if line is None or not line:
            return _INCOMPLETE
        prefix, rest = line[:1], line[1:]  # the reply's type
        if prefix == b"+":
            return rest
        if prefix == b"-":
            return ReplyError(rest.decode("utf-8", "replace"))
        if prefix == b":":
            return int(rest)
        if prefix == b"$":
            length = int(rest)
            if length < 0:
                return None
            end = self._pos + length
            if len(self._buffer) < end + 2:
                return _INCOMPLETE
            data = bytes(self._buffer[self._pos : end])
            self._pos = end + 2
            return data
        if prefix == b"*":
            count = int(rest)
            if count < 0:
                return None
            items = []
            for _ in range(count):
                item = self._parse()
                if item is _INCOMPLETE:
                    return _INCOMPLETE
                items.append(item)
            return items
        raise ValueError(f"unexpected RESP reply type {prefix!r}")


_hiredis: Any
try:  # pragma: no branch - which branch runs depends on the environment
    import hiredis as _hiredis
except ImportError:  # pragma: no cover - exercised by the pure-Python reader tests instead
    _hiredis = None


PROTOCOL_ERRORS: tuple[type[Exception], ...] = (ValueError,)
"""What a reader's ``gets()`` raises on bytes that are not RESP (hiredis: ``ProtocolError``;
the Python reader: ``ValueError``). The transports turn it into a node failure
(:data:`BAD_REPLY`): such a node is counted against the quorum, and its connection replaced."""
if _hiredis is not None:  # pragma: no branch
    PROTOCOL_ERRORS = (ValueError, _hiredis.ProtocolError)

BAD_REPLY = "protocol error: the node's reply is not RESP"


def make_reader(*, prefer_hiredis: bool = True) -> Reader:
    """A new reply reader: hiredis when available (and preferred), else the Python one."""
    if prefer_hiredis and _hiredis is not None:
        reader: Reader = _hiredis.Reader(replyError=ReplyError)
        return reader
    return PythonReader()
