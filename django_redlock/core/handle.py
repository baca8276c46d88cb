"""A held lease as a small value another process can adopt: :class:`LeaseHandle`.

``lease.handle()`` gives it and lets go of the lease in this process; ``m.adopt(handle)`` in
another process (a view acquires, a Celery task finishes the work) moves the keys to a new
token on a quorum (``scripts/handoff.lua``) and returns a lease that can extend and release.
The handle holds the lease token: a bearer secret, so it is never shown in its ``repr`` or
``str``; pass it the way you pass credentials (Celery: keep it out of ``argsrepr``).
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from dataclasses import dataclass, field
from typing import Any

from django_redlock.procedures.arguments import MAX_TTL, validate_name

__all__ = ["LeaseHandle", "as_handle"]

_PREFIX = "rlh1."
_TOKEN_LENGTH = 40  # secrets.token_hex(20), as every lease token


@dataclass(frozen=True)
class LeaseHandle:
    """What ``m.adopt`` needs to take a lease over. Picklable, and a plain ``str`` through
    :meth:`dumps` / :meth:`loads` (for a task argument or a JSON payload).

    Attributes:
        name: the lock name.
        key: the Redis key on every node (the manager's prefix + name).
        ttl: the lease length in seconds; the adopter's extensions renew to it.
        fencing_token: the database-minted fencing token, or None.
    """

    name: str
    key: str
    token: str = field(repr=False)
    ttl: float
    fencing_token: int | None = None

    def __str__(self) -> str:
        return f"<LeaseHandle {self.name!r}>"

    def dumps(self) -> str:
        """The handle as text: ``rlh1.`` and URL-safe base64 of its JSON (holds the token)."""
        payload = {
            "name": self.name,
            "key": self.key,
            "token": self.token,
            "ttl": self.ttl,
            "fencing_token": self.fencing_token,
        }
        data = json.dumps(payload, separators=(",", ":")).encode()
        return _PREFIX + base64.urlsafe_b64encode(data).decode()

    @classmethod
    def loads(cls, text: str) -> LeaseHandle:
        """The handle :meth:`dumps` wrote.

        Raises:
            TypeError, ValueError: not such a text (naming ``handle``).
        """
        return as_handle(text)


def as_handle(value: object) -> LeaseHandle:
    """``value`` (a :class:`LeaseHandle` or its :meth:`~LeaseHandle.dumps` text) checked.

    Raises:
        TypeError: neither a LeaseHandle nor a str.
        ValueError: a text that is not a handle, or a handle with impossible fields.
    """
    if isinstance(value, LeaseHandle):
        fields: dict[str, Any] = {
            "name": value.name,
            "key": value.key,
            "token": value.token,
            "ttl": value.ttl,
            "fencing_token": value.fencing_token,
        }
    elif isinstance(value, str):
        if not value.startswith(_PREFIX):
            raise ValueError("handle is not a lease handle (lease.handle().dumps() text)")
        try:
            fields = json.loads(base64.urlsafe_b64decode(value[len(_PREFIX) :].encode()))
        except (binascii.Error, ValueError, UnicodeDecodeError):
            raise ValueError("handle is not a lease handle: its text is damaged") from None
        if not isinstance(fields, dict):
            raise ValueError("handle is not a lease handle: its text is damaged")
    else:
        raise TypeError(f"handle must be a LeaseHandle or its text, not {type(value).__name__}")
    name, key, token = fields.get("name"), fields.get("key"), fields.get("token")
    ttl, fencing = fields.get("ttl"), fields.get("fencing_token")
    if not isinstance(key, str) or not key or not isinstance(name, str):
        raise ValueError("handle names no lock")
    try:
        name = validate_name(name)
    except (TypeError, ValueError) as error:
        raise ValueError(f"handle names no valid lock: {error}") from None
    # Lowercase hex, as secrets.token_hex writes it (str.isalnum would take any Unicode).
    if (
        not isinstance(token, str)
        or len(token) != _TOKEN_LENGTH
        or token.strip("0123456789abcdef") != ""
    ):
        raise ValueError("handle holds no valid lease token")
    if (
        isinstance(ttl, bool)
        or not isinstance(ttl, int | float)
        or not math.isfinite(ttl)
        or not 0 < ttl <= MAX_TTL
    ):
        raise ValueError("handle holds no valid ttl")
    if fencing is not None and (isinstance(fencing, bool) or not isinstance(fencing, int)):
        raise ValueError("handle holds no valid fencing token")
    # Plain str and int: an adopted lease keeps them in its state, which nothing held in it
    # may refer back from (a held lease may be untracked: core.lease's _cycle_free).
    return LeaseHandle(
        name=name,
        key=str.__str__(key),
        token=str.__str__(token),
        ttl=float(ttl),
        fencing_token=None if fencing is None else int.__index__(fencing),
    )
