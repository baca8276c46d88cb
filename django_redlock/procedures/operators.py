"""The procedures of the calls that read or clear a lock whoever holds it: ``holder`` (and
``locked``, which reads it) and ``force_release``. Each is one round that must hear every
node, or its deadline."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any, Protocol

from django_redlock.procedures import flow
from django_redlock.procedures.effects import Effect, Round

__all__ = ["OperatorHost", "force_release", "holder"]


class _Reporter(Protocol):
    def force_released(self, name: str, deleted: int) -> None: ...


class OperatorHost(Protocol):
    """What these calls ask of their host (the engine): the nodes, the key of a name, and
    the reporter that tells a force release."""

    @property
    def nodes(self) -> flow.Nodes: ...

    @property
    def reporter(self) -> _Reporter: ...

    def key(self, name: str) -> str: ...


def holder(host: OperatorHost, name: str) -> Generator[Effect, Any, dict[str, Any] | None]:
    """Who holds lock ``name`` (``flow.holder_of``: the owner record most nodes that answered
    hold, with ``nodes`` and ``ttl``), or None.

    Raises:
        TypeError, ValueError: a bad name.
    """
    size = host.nodes.size
    # Every node's answer is wanted: never given up before the last one.
    exchange = yield Round(flow.holder_round(size, host.key(name)), None, size, size)
    return flow.holder_of(exchange.results)


def force_release(host: OperatorHost, name: str) -> Generator[Effect, Any, int]:
    """Delete lock ``name`` on every node, whoever holds it; how many nodes had it.

    Raises:
        TypeError, ValueError: a bad name.
    """
    size = host.nodes.size
    exchange = yield Round(flow.force_release_round(size, host.key(name)), 1, size, size)
    deleted: int = exchange.yes
    host.reporter.force_released(name, deleted)
    return deleted
