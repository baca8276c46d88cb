"""What a node's result can be besides a reply: a failure, or no answer (yet).

Shared by the sync and asyncio transports, so both managers see the same outcomes.
"""

from __future__ import annotations

__all__ = ["PENDING", "TIMED_OUT", "NodeError", "NotSent"]


class NodeError(Exception):
    """A node failed: refused, reset, timed out, answered with an error or with bytes that
    are not RESP."""


class NotSent(NodeError):
    """The command was never written to the node (it could not be reached, or owed too many
    replies): there is nothing on that node for a clean-up to undo."""


class _TimedOut:
    """The marker result of a node that did not answer within the per-node timeout."""

    def __repr__(self) -> str:
        return "TIMED_OUT"


TIMED_OUT = _TimedOut()


class _Pending:
    """The marker result of a node whose reply was not waited for (the outcome was known)."""

    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()
