"""The names waiting acquires are woken by: pub/sub channels and waiter ids, the same for
both transports' subscribers and for ``scripts/wake_next.lua``.

Each subscriber is a *listener* with its own channel per lock (the lock key, ``"\\x00w"``, the
listener id), and its waiters' ids start with the listener id. A release publishes the id of
the first waiter in line to that waiter's listener's channel only.
"""

from __future__ import annotations

import secrets

__all__ = ["hear_message", "new_listener_id", "new_waiter_id", "note_grant", "wake_channel"]


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


def hear_message(message: bytes) -> tuple[bytes, int | None]:
    """What a release published to a waiter (``scripts/wake_next.lua``, ``hand_grant.lua``):
    its waiter id, and the round a hand-off grant names (None for a plain wake-up)."""
    waiter, _, round_ = message.partition(b" ")
    return waiter, int(round_) if round_.isdigit() else None


def note_grant(
    granted: dict[bytes, dict[int, int]], waiter: bytes, index: int, round_: int
) -> None:
    """Record that node ``index`` granted ``waiter`` the lock naming ``round_`` (the latest
    round a node names is the one that counts: see ``flow.Acquire.hear_grants``)."""
    grants = granted.setdefault(waiter, {})
    grants[index] = max(grants.get(index, 0), round_)
