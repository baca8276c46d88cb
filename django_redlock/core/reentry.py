"""The re-entry registry: held leases by owner scope and name, held weakly, at little cost to
the garbage collector (issue 28). The engine keeps one (``Engine.held``); what a scope holding
many leases leaves untracked is decided by the switch in :mod:`django_redlock.core.untracking`.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from typing import Any, Generic, TypeVar

try:
    # CPython's atomic "delete this key if its weak reference is dead", which
    # weakref.WeakValueDictionary uses (not in typeshed).
    from _weakref import _remove_dead_weakref  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - other Pythons: the same rule, in Python

    def _remove_dead_weakref(table: dict[Any, Any], key: object) -> None:
        ref = table.get(key)
        if ref is not None and ref() is None:
            del table[key]


from django_redlock.core.untracking import LEASES_UNTRACKED, UNTRACK_AT, untrack

__all__ = ["Reentry"]

_V = TypeVar("_V")


class _Entries(dict):  # type: ignore[type-arg]  # dict[str, weakref.ref[_V]]
    """One owner scope's entries in a :class:`Reentry`: lock name -> plain weak reference.

    Keyed by the name alone: a collection visits only the values of a dict whose keys are
    all ``str``, where a ``(scope, name)`` key was one more object per held lease to visit
    (a tuple of its own, scattered in memory: a cache miss in each collection).
    """

    # No __init__ of its own (one is made on a thread's first acquire while it holds
    # nothing, so on the hot path: dict's own is C): Reentry.put sets both.
    __slots__ = ("scope", "sweep_at")

    # The scope's one tuple while it holds leases: every lease registered under it keeps
    # this one (see Reentry.put), so an asyncio task holding many leases makes one tracked
    # scope tuple, not one per lease.
    scope: tuple[object, ...]
    # Swept when it holds this many entries (dead ones included).
    sweep_at: int


class Reentry(Generic[_V]):
    """Held leases by owner scope (pid, thread id, asyncio task or None: see
    ``core.owner.owner_scope``) and name, held weakly: the engine's re-entry registry.

    What a ``weakref.WeakValueDictionary`` keyed by ``(scope, name)`` did, at less cost to
    the garbage collector and to each acquire. Per held lease there is one plain weak
    reference with no callback (the one ``weakref.ref(lease)`` that CPython shares with the
    extender's), in which a collection visits nothing, in a dict per scope keyed by the name
    (see :class:`_Entries`); a ``WeakValueDictionary`` kept a ``KeyedRef`` (key, callback,
    class) and the key tuple. Once a scope holds many leases, that weak reference is one the
    collector does not track either (see ``core.untracking``): a held lease is then one
    tracked object, itself; and a thread's dict of them one the collector does not track
    (see :func:`_untrack_entries`): a collection reads the lease and its state tuple only.
    A lease dropped without release leaves a dead reference:
    ``get`` returns None for it, and dead entries are removed each time a scope's dict has
    doubled since its last sweep (so the work is constant per entry added) and by ``len``.

    Only code running in a scope's thread puts entries under it (the thread itself, or the
    asyncio task, which runs in it), so a scope's dict is created, and removed once empty,
    only by that thread: a release from another thread leaves an empty dict, which that
    thread's next put reuses (or a sweep drops, once its task is done).
    """

    __slots__ = ("_scopes", "_sweep_at", "_untrackable")

    _FIRST_SWEEP = 64

    def __init__(self, untrackable: Callable[[_V], bool] = lambda value: False) -> None:
        """``untrackable(value)``: whether a value put here, once its scope holds many, may
        be untracked by the collector itself (it can refer to nothing that refers back to
        it: see ``core.lease.cycle_free``)."""
        self._scopes: dict[tuple[object, ...], _Entries] = {}
        self._sweep_at = self._FIRST_SWEEP
        self._untrackable = untrackable

    def get(self, scope: tuple[object, ...], name: str) -> _V | None:
        """The live value ``scope`` registered under ``name``, or None."""
        entries = self._scopes.get(scope)
        if entries is None:
            return None
        ref = entries.get(name)
        return None if ref is None else ref()

    def put(self, scope: tuple[object, ...], name: str, value: _V) -> tuple[object, ...]:
        """Register ``value`` under ``scope`` and ``name`` (replacing any entry there), from
        ``scope``'s own thread; returns the scope tuple the registry keeps for ``scope``
        (equal to it), for the value to keep instead of its own."""
        scopes = self._scopes
        entries = scopes.get(scope)
        if entries is None:
            entries = scopes[scope] = _Entries()
            entries.scope = scope
            entries.sweep_at = self._FIRST_SWEEP
            entries[name] = weakref.ref(value)
            # Only after the put: a sweep drops this thread's empty dicts, this new one too.
            if len(scopes) >= self._sweep_at:
                self._sweep()
            return scope
        ref = weakref.ref(value)
        # What the dict holds after this put, at most (a name already there adds nothing).
        size = len(entries) + 1
        if size >= UNTRACK_AT:  # a scope holding many leases: see core.untracking
            untrack(id(ref))  # before it goes in: an untracked dict never holds it tracked
            entries[name] = ref
            task = entries.scope[2]
            # A thread's scope, or a task's held weakly (core.owner.owner_scope): see
            # _untrack_entries. A task held strongly (one that cannot be weakly referenced)
            # keeps its dict, and its leases, tracked.
            if task is None or type(task) is weakref.ref:
                _untrack_entries(entries, size == UNTRACK_AT)
                # The lease too (see LEASES_UNTRACKED): no other thread has it yet.
                if LEASES_UNTRACKED and self._untrackable(value):
                    untrack(id(value))
        else:
            entries[name] = ref
        if len(entries) >= entries.sweep_at:
            _sweep_entries(entries)
        return entries.scope

    def remove(self, scope: tuple[object, ...], name: str, value: object) -> None:
        """Drop the entry under ``scope`` and ``name`` if it is ``value``'s (from any
        thread: only the scope's own thread registers under it, so the entry checked is the
        one deleted, and a sweep deletes only a dead one)."""
        entries = self._scopes.get(scope)
        if entries is None:
            return
        ref = entries.get(name)
        if ref is None or ref() is not value:
            return
        del entries[name]
        if not entries and scope[1] == threading.get_ident():
            # Its own thread, so no put under it runs meanwhile: no entry is lost with it.
            # (An empty dict left by another thread's release is reused, or swept.)
            del self._scopes[scope]

    def __bool__(self) -> bool:
        """Whether any scope has an entry, live or not yet swept (O(1): the managers ask it
        before every lookup, so that a process holding nothing does no lookup)."""
        return bool(self._scopes)

    def __len__(self) -> int:
        """The live entries (dead ones are swept first: O(entries))."""
        self._sweep()
        return sum(len(entries) for entries in list(self._scopes.values()))

    def _sweep(self) -> None:
        """Remove the dead entries of every scope, and the empty dicts of scopes that can
        put no more: an asyncio task that is done (none of its code runs again), or this
        thread's own."""
        scopes = self._scopes
        me = threading.get_ident()
        for scope, entries in list(scopes.items()):
            _sweep_entries(entries)
            if not entries:
                owner: Any = scope[2]
                if owner is None:
                    over = scope[1] == me
                else:
                    task = owner() if type(owner) is weakref.ref else owner
                    over = task is None or task.done()  # gone, or done
                if over and scopes.get(scope) is entries and not entries:
                    del scopes[scope]
        self._sweep_at = max(self._FIRST_SWEEP, 2 * len(scopes))


def _untrack_entries(entries: _Entries, crossing: bool) -> None:
    """Make a thread's ``entries``, past ``UNTRACK_AT`` of them, a dict the collector does
    not track (and, when ``crossing`` that threshold, the weak references put below it).

    Such a dict holds ``str`` keys, untracked plain weak references (which hold no strong
    reference: see ``core.untracking``), and in its slots the scope tuple (pid, thread id,
    None or a weak reference to a task) and an int: it can be in no reference cycle, so a
    collection has nothing to find in it, and untracked it reads none of the weak references
    either (a dict's traversal visits each value: the header of each, a cache miss per held
    lease per pass).
    A held lease then costs a collection what the pure-Python floor does: itself and its
    state tuple. The dict still holds its weak references as before; their referents are
    freed, and the references cleared, by reference counting or by the collector as before.

    An asyncio task's scope too: its tuple holds the task only weakly (pid, thread id, a weak
    reference with no callback: core.owner.owner_scope), so the dict reaches no task. (A
    task that cannot be weakly referenced is held, and its dict stays tracked: an untracked
    container hides its references from the collector, so the task and all it reaches would
    look referenced from outside, and a cycle through it could never be collected.)

    Called after each put past the threshold: CPython up to 3.13 tracks an untracked dict
    again on any insert of a value of a GC type (a weak reference is one, tracked or not:
    ``MAINTAIN_TRACKING`` in ``Objects/dictobject.c``); a put below it leaves it tracked,
    and the next crossing untracks it again. 3.14 no longer tracks dicts on insert: there a
    dict once untracked stays so, and the weak references put into it below the threshold
    stay tracked (safe: none can close a cycle; each is then one more tracked object).
    Removes and sweeps only delete, which never tracks a dict.
    """
    if crossing:
        # A copy: another thread's release or sweep may delete meanwhile (the list keeps
        # each reference alive until it is untracked). Only this thread puts under it.
        for ref in list(entries.values()):
            untrack(id(ref))
    untrack(id(entries))


def _sweep_entries(entries: _Entries) -> None:
    """Remove ``entries``' dead weak references."""
    # Another thread may put a live lease under a dead entry's key meanwhile (the sweep is
    # anyone's): removed only if still dead, at once.
    for key, ref in list(entries.items()):
        if ref() is None:
            _remove_dead_weakref(entries, key)
    entries.sweep_at = max(Reentry._FIRST_SWEEP, 2 * len(entries))
