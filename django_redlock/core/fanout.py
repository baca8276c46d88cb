"""Operator queries ask every node at once: :func:`each_node`, and :class:`LockNodes`, what
they need to know of a manager. Imports no Django."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Protocol, TypeVar

from django_redlock.wire.nodes import NodeAddress

__all__ = ["LockNodes", "each_node"]


class LockNodes(Protocol):
    """What the operator queries need to know of a manager's nodes
    (:class:`~django_redlock.LockManager` is one)."""

    @property
    def addresses(self) -> tuple[NodeAddress, ...]:
        """The nodes, in the manager's order."""

    @property
    def key_prefix(self) -> str:
        """Prepended to every lock name to form its key."""

    @property
    def quorum(self) -> int:
        """How many nodes make a majority."""

    @property
    def quarantine_ms(self) -> int:
        """The restart quarantine the manager sends with every acquire, in milliseconds."""


_T = TypeVar("_T")
_Item = TypeVar("_Item")


def each_node(items: Sequence[_Item], probe: Callable[[_Item], _T]) -> list[_T]:
    """``probe`` on every node's item at once (a thread each), in order: a stopped or paused
    node costs one timeout for the whole call, not one per node."""
    if len(items) <= 1:
        return [probe(item) for item in items]
    with ThreadPoolExecutor(max_workers=len(items)) as pool:
        return list(pool.map(probe, items))
