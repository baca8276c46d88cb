"""Which process this is, without a syscall per lock operation.

``os.getpid()`` is a real system call (about 1 µs here, several per acquire on the hot path).
The pid only changes across ``fork()``, so it is cached and refreshed in the child by an
``os.register_at_fork`` hook. Everything that must not be shared with a forked child (sockets,
random-token buffers, owner metadata) compares :func:`current_pid` with the pid it recorded.
"""

from __future__ import annotations

import os

__all__ = ["PID", "current_pid"]

PID = os.getpid()
"""This process's id, refreshed in a forked child. Read it as ``process.PID`` (an attribute
of the module, not a name imported from it, which would keep the parent's value): on the
hot path that is a load instead of the call :func:`current_pid` costs."""

_pid = PID


def _after_fork_in_child() -> None:
    global _pid, PID
    _pid = PID = os.getpid()


os.register_at_fork(after_in_child=_after_fork_in_child)


def current_pid() -> int:
    """This process's id, cached (refreshed after every fork)."""
    return _pid
