"""The names waiting acquires are woken by: pub/sub channels and waiter ids, the same for
both transports' subscribers and for ``scripts/wake_next.lua``.

Each subscriber is a *listener* with its own channel per lock (the lock key, ``"\\x00w"``, the
listener id), and its waiters' ids start with the listener id. A release publishes the id of
the first waiter in line to that waiter's listener's channel only.
"""

from __future__ import annotations

import secrets

__all__ = ["new_listener_id", "new_waiter_id", "wake_channel"]


def new_listener_id() -> str:
    """A fresh listener id (one subscriber, of one manager in one process or event loop)."""
    return secrets.token_hex(6)


def wake_channel(key: str, listener: str) -> str:
    """The pub/sub channel on which ``listener``'s waiters for lock ``key`` are woken (the
    name ``scripts/wake_next.lua`` publishes to: the key, NUL, ``w``, the listener id)."""
    return f"{key}\x00w{listener}"


def new_waiter_id(listener: str) -> str:
    """A fresh id for one blocking acquire of ``listener``: ``<listener>.<nonce>``."""
    return f"{listener}.{secrets.token_hex(4)}"
