"""A simulated fenced table: the rule of ``FencedModel`` (``django_redlock/fencing.py``,
``models.py``), without Django or a database.

What the real fence does, and what is modelled of it here:

* **Mint.** ``lock_for(instance)`` bumps the row's ``fencing_token`` once the Redlock is held,
  in one committed statement: the new token is above every token minted for that row
  (``_advance_counter``: ``max(counter + 1, row)``). Here: :meth:`Table.mint`, one atomic step
  at the database, which the client reaches over its own connection (a message delay each
  way, no loss: the database is not one of the Redlock nodes and its faults are not modelled).
* **Conditional write.** ``save()`` under the block adds ``AND fencing_token = <token>``; no
  row matched means a newer mint happened (``StaleFencingToken``), and nothing is written.
  Here: :meth:`Table.write`, by :func:`accepts`, checked when the write reaches the database.
* **The admin's force release** mints first, then frees the lock: the evicted holder is fenced
  off before anyone else can take the lock (``admin.py``). Here: :meth:`Table.mint` with no
  client, then the real ``force_release`` round (``world.World.force_release``).

The invariant (``invariants.Checker.written``): a write the table accepts carries the highest
token minted for its row so far. It holds whatever Redlock does, so it is checked even after
faults outside the model (clock jumps, a wrong ``declare_fresh``), when two holders may well
overlap: the fence, not the lock, must refuse the stale one.
"""

from __future__ import annotations

from dataclasses import dataclass, field


def accepts(row_token: int, token: int) -> bool:
    """The fenced write's condition (``WHERE ... AND fencing_token = <token>``): the row
    still carries the writer's token. The ``fence-off`` mutant replaces it."""
    return row_token == token


@dataclass
class Table:
    """One fenced row per lock name: its ``fencing_token`` column and the rows written."""

    tokens: dict[str, int] = field(default_factory=dict)
    writes: int = 0
    refused: int = 0

    def mint(self, name: str) -> int:
        """Bump the row of ``name`` and return its new token (``mint_for_row``)."""
        token = self.tokens.get(name, 0) + 1
        self.tokens[name] = token
        return token

    def write(self, name: str, token: int) -> bool:
        """A fenced ``save()`` of the row of ``name`` under ``token``: True when written."""
        if accepts(self.tokens.get(name, 0), token):
            self.writes += 1
            return True
        self.refused += 1
        return False


__all__ = ["Table", "accepts"]
