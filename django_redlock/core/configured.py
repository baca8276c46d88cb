"""What both managers show of their engine's configuration: :class:`EngineConfigured`.

:class:`~django_redlock.core.manager.LockManager` and
:class:`~django_redlock.core.amanager.AsyncLockManager` hold one
:class:`~django_redlock.core.engine.Engine` each (or share one); the read-only settings, the
key of a name and the ``repr`` are the same for both, so they are written here once.
"""

from __future__ import annotations

from django_redlock.core.engine import Engine
from django_redlock.core.reporting import LockObserver
from django_redlock.wire.nodes import NodeAddress

__all__ = ["EngineConfigured"]


class EngineConfigured:
    """The configuration of a manager, read from its :attr:`engine` (seconds for times)."""

    engine: Engine

    @property
    def addresses(self) -> tuple[NodeAddress, ...]:
        """The nodes, parsed (URL parts, TLS, credentials)."""
        return self.engine.addresses

    @property
    def nodes(self) -> tuple[str, ...]:
        """The nodes' labels (URLs without passwords)."""
        return self.engine.nodes.labels

    @property
    def quorum(self) -> int:
        """How many nodes must agree: ``N // 2 + 1``."""
        return self.engine.quorum

    @property
    def ttl(self) -> float:
        """Default lease length in seconds."""
        return self.engine.ttl

    @property
    def max_ttl(self) -> float:
        """The longest lease an acquire may ask for, in seconds (and the restart quarantine)."""
        return self.engine.max_ttl

    @property
    def node_timeout(self) -> float:
        """Seconds each node has per command."""
        return self.engine.node_timeout

    @property
    def retry_delay(self) -> float:
        """Mean seconds between attempts of a blocking acquire (±50% jitter)."""
        return self.engine.retry_delay

    @property
    def default_timeout(self) -> float | None:
        """Seconds a blocking acquire waits when not told (None: forever)."""
        return self.engine.default_timeout

    @property
    def drift_factor(self) -> float:
        """Share of the ttl set aside for clock drift."""
        return self.engine.drift_factor

    @property
    def key_prefix(self) -> str:
        """Prepended to every lock name to form the Redis key."""
        return self.engine.key_prefix

    @property
    def observer(self) -> LockObserver | None:
        """Told of every acquire, release, renewal, loss and give-up (or None)."""
        return self.engine.observer

    @property
    def quarantine_ms(self) -> int:
        """The restart quarantine sent with every acquire, in milliseconds: ``max_ttl``,
        raised to the longest any node reports (``scripts/node_rule.lua``)."""
        return self.engine.quarantine.ms

    def __repr__(self) -> str:
        engine = self.engine
        return (
            f"<{type(self).__name__} quorum {engine.quorum} of {len(engine.addresses)}: "
            f"{engine.describe()}>"
        )

    def key(self, name: str) -> str:
        """The Redis key of lock ``name``.

        Raises:
            TypeError, ValueError: a bad name.
        """
        return self.engine.key(name)
