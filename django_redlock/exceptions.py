"""The errors django_redlock raises on purpose.

Factored out of ``redlock.py`` so that every layer (core, Django integration, user code) can
import them without import loops. The tree::

    RedlockError                  base of everything the library raises on purpose
    ├── LockNotAcquired           acquire gave up; carries name, votes, quorum, per-node errors
    │   ├── LockContended         another holder has it (trying later may work)
    │   └── QuorumUnreachable     too many nodes failed or timed out (infrastructure)
    │       └── LeaseNotExtended  an extend reached no quorum either way: the lease keeps the
    │                             validity it had (a failed renewal is not a loss)
    ├── LockLost                  the lease ended: its validity ran out, or a quorum of nodes
    │                             says it no longer holds it (cause: expired, taken, gone)
    ├── LeaseReleased             extend/release/check on a lease this process already released
    ├── LeaseInherited            extend/release/check in a forked child, on its parent's lease
    ├── StaleFencingToken         a FencedModel write was refused: a newer holder exists
    ├── FencingUnavailable        no fencing token could be minted (row missing or locked)
    └── UnfencedWrite             a FencedModel that requires fencing was written outside a lock

Bad arguments are ``ValueError``/``TypeError`` instead, naming the argument.

No message ever contains a lease token or a node password: node errors are keyed by the
node's redacted label (``host:port/db`` or the socket path).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

__all__ = [
    "FencingUnavailable",
    "LeaseInherited",
    "LeaseNotExtended",
    "LeaseReleased",
    "LockContended",
    "LockLost",
    "LockNotAcquired",
    "QuorumUnreachable",
    "RedlockError",
    "StaleFencingToken",
    "UnfencedWrite",
]


class RedlockError(Exception):
    """Base class of every error django_redlock raises on purpose.

    The errors below keep their constructor's arguments in ``args`` and their sentence in
    ``str()``, so they cross process boundaries intact: pickle (multiprocessing) and Celery's
    result backends rebuild them as ``cls(*args)``.
    """

    _text: str | None = None

    def __str__(self) -> str:
        return self._text if self._text is not None else super().__str__()


class LockNotAcquired(RedlockError):
    """``acquire`` gave up without a lease.

    Attributes:
        name: the lock name (not the Redis key).
        votes: how many nodes granted the lock in the last attempt.
        quorum: how many grants were needed (``N // 2 + 1``).
        node_errors: redacted node label -> short error text, for nodes that failed or timed
            out in the last attempt (nodes that answered "held by someone else" are not errors).
        retry_after: seconds until the holder's keys have run out on enough nodes for a
            quorum to be free (read from the nodes: their remaining TTLs), if it does not
            renew; ``None`` when unknown. Used for ``Retry-After`` headers.
        attempts: how many attempts were made before giving up.
        origin: where the acquire came from (a view or command name), when given.
        quarantined: when nodes refused because they restarted without proof that they kept
            their locks (QUARANTINED), the seconds until enough of them vote again for a
            quorum; else None. ``retry_after`` is then the same.
        node_answers: redacted node label -> what that node answered in the last attempt,
            for every node (``granted``, ``held by another holder, 1.2 s left``, ``not
            waited for``, or its error), so the text counts and names them all; empty when
            the error was built without them.
        reason: why the acquire gave up when it is not a node's answer ("" when the answers
            say it): it gave up early on a total outage, or the attempt took so long that
            nothing was left of the lease.
    """

    def __init__(
        self,
        name: str,
        votes: int,
        quorum: int,
        node_errors: Mapping[str, str] | None = None,
        retry_after: float | None = None,
        attempts: int = 1,
        origin: str | None = None,
        quarantined: float | None = None,
        node_answers: Mapping[str, str] | None = None,
        reason: str = "",
    ) -> None:
        self.name = name
        self.origin = origin
        self.reason = reason
        self.votes = votes
        self.quorum = quorum
        self.node_errors: dict[str, str] = dict(node_errors or {})
        self.retry_after = retry_after
        self.attempts = attempts
        self.quarantined = quarantined
        self.node_answers: dict[str, str] = dict(node_answers or {})
        super().__init__(
            name,
            votes,
            quorum,
            self.node_errors,
            retry_after,
            attempts,
            origin,
            quarantined,
            self.node_answers,
            reason,
        )
        self._text = self._message()

    def _message(self) -> str:
        text = (
            f"lock {self.name!r} not acquired: {self.votes} of {_count(self.quorum, 'vote')} "
            "needed"
            + (f" from {_count(len(self.node_answers), 'node')}" if self.node_answers else "")
            + f" after {_count(self.attempts, 'attempt')}"
        )
        if self.reason:
            text += f"; {self.reason}"
        if self.quarantined is not None:
            refusing = [node for node, error in self.node_errors.items() if is_restarted(error)]
            # The nodes are named once, in the details below (the hint counts them).
            text += "; " + quarantine_hint(refusing, self.quarantined, named=False)
        if self.node_answers:
            # Every node, the ones that voted too: "0 of 2 votes" beside only the failed
            # nodes read as if the others were down.
            text += f" (nodes: {_grouped(self.node_answers)})"
        elif self.node_errors:
            text += f" (node errors: {_grouped(self.node_errors)})"
        if any(error.startswith(_NO_ANSWER) for error in self.node_errors.values()):
            # The flow's text gives the wait in ms, not where it is set (issue 40, item 6).
            text += f"; {NODE_TIMEOUT_NAMES}"
        return text


_QUARANTINED = "QUARANTINED "
_NOT_WAITED_FOR = "not waited for"  # procedures/flow.py's node_answers
_RESTARTED = "QUARANTINED up "
_NO_ANSWER = "no answer within "

NODE_TIMEOUT_NAMES = (
    "the wait per node is the node timeout (node_timeout=, REDLOCK['NODE_TIMEOUT'] in Django)"
)
"""Where the per-node wait of a ``no answer within N ms`` error is set."""


def is_quarantined(error: str) -> bool:
    """Whether a node's error text is a refusal to vote (``scripts/node_rule.lua``): after a
    restart, after a failover, or as a replica."""
    return error.startswith(_QUARANTINED)


def is_restarted(error: str) -> bool:
    """Whether a node's error text is a restart-quarantine refusal: the one a declaration can
    lift for a brand-new node (a promoted replica votes again by itself; a replica never)."""
    return error.startswith(_RESTARTED)


def _count(number: int, noun: str) -> str:
    """``number`` and ``noun``, plural unless one: "1 node", "3 nodes"."""
    return f"{number} {noun}{'' if number == 1 else 's'}"


def _shown(answer: str) -> str:
    """A node's answer or error as a message shows it: a quarantine refusal without its code
    word, and a reply not waited for with why (the round's outcome was known without it)."""
    if is_quarantined(answer):
        return "quarantined, " + answer[len(_QUARANTINED) :]
    if answer == _NOT_WAITED_FOR:
        return f"{answer} (the outcome was known without it)"
    return answer


def _grouped(said: Mapping[str, str]) -> str:
    """Node label -> answer, as a message shows it: the nodes that said the same thing named
    together, in the order they first appear ("a, b: quarantined, ...; c: granted"), so five
    nodes refusing alike read as one refusal, not five."""
    nodes_by_answer: dict[str, list[str]] = {}
    for node, answer in said.items():
        nodes_by_answer.setdefault(_shown(answer), []).append(node)
    return "; ".join(f"{', '.join(nodes)}: {answer}" for answer, nodes in nodes_by_answer.items())


def quarantine_hint(nodes: list[str], seconds: float | None, *, named: bool = True) -> str:
    """The one sentence every quarantine report ends with (the error, the log, the status):
    which nodes refuse, when a quorum votes again by itself, and the one command that is safe
    to run as printed.

    Args:
        nodes: the labels (passwords already hidden) of the nodes refusing after a restart
            (:func:`is_restarted`); empty when the refusals are failovers' or replicas', whose
            texts say what to do: then only the wait.
        seconds: until a quorum votes again by itself (None: unknown, or only these nodes).
        named: name the nodes (False: count them, where the text names each node after).

    ``redlock_declare_fresh`` with no node named lets a node vote only when it can show that
    no other node ever saw it vote (a brand-new node); it refuses a node that may have
    forgotten locks and says how long that node still waits, so following this hint never
    makes such a node vote (docs/howto/operating.md, "Restarts").
    """
    listed = ", ".join(nodes)
    wait = (
        f"a quorum votes again in {math.ceil(seconds)} s by itself"
        if seconds is not None
        else "each votes again by itself when its wait ends"
    )
    if not nodes:
        return f"nodes refuse to vote; {wait}"
    one = len(nodes) == 1
    # "Since it started": a node cannot tell its first start from a restart that lost data,
    # and a message that says "restart" of a node just created misleads.
    they, their, them = ("it", "its", "it") if one else ("they", "their", "them")
    which = f"quarantined since {they} started, not proven to have kept {their} locks"
    which = f"{which}: {listed}" if named else f"{len(nodes)} node{'' if one else 's'} {which}"
    return (
        f"{which}; {wait}; if {they} {'is' if one else 'are'} brand-new, {_SAFE_COMMAND_WHERE} "
        f"lets {them} vote now ({_SAFE_BECAUSE})"
    )


# As users type it (run as printed: "manage.py" alone is not a command in a shell). An error
# may reach a user of the core alone, who has no manage.py (and whose manager's
# declare_fresh() checks nothing): it says where the command is; the status command and the
# admin page are Django's own.
_SAFE_COMMAND = "python manage.py redlock_declare_fresh"
_SAFE_COMMAND_WHERE = f"{_SAFE_COMMAND} (in a Django project)"
_SAFE_BECAUSE = "it declares only nodes it can show are brand-new, and asks about the rest"

NODE_HINT = f"if it is brand-new, {_SAFE_COMMAND} lets it vote now ({_SAFE_BECAUSE})"
"""What a page or status line that already names one quarantined node adds to its refusal."""


class LockContended(LockNotAcquired):
    """Another holder has the lock on enough nodes that no quorum was possible; try later."""


class QuorumUnreachable(LockNotAcquired):
    """Too many nodes failed or timed out for a quorum: an infrastructure problem."""


class LeaseNotExtended(QuorumUnreachable):
    """An extend (``lease.extend()``, or a renewal of the extender) was not confirmed by a
    quorum, and no quorum refused it either: nodes did not answer, or too few of them still
    held the key to renew it. Nothing changed on the lease: it keeps the validity it had
    (``lease.validity``) and its keys, and may be extended again before that runs out.

    A subclass of :class:`QuorumUnreachable` (an infrastructure problem); never a
    :class:`LockLost`, because the lease has not ended: no other holder can take it while
    its validity lasts (the keys are still on the nodes that granted it).

    Attributes (beyond :class:`LockNotAcquired`'s; ``votes`` is the nodes that renewed it):
        validity: seconds of validity the lease still had when the round was judged.
        refused: nodes that answered they do not hold the lease (absent or another token).
    """

    def __init__(
        self,
        name: str,
        votes: int,
        quorum: int,
        node_errors: Mapping[str, str] | None = None,
        validity: float = 0.0,
        refused: int = 0,
        detail: str = "",
    ) -> None:
        self.validity = validity
        self.refused = refused
        self.detail = detail
        super().__init__(name, votes, quorum, node_errors)
        self.args = (name, votes, quorum, self.node_errors, validity, refused, detail)

    def _message(self) -> str:
        return (
            f"lease on {self.name!r} not extended: {self.detail or f'{self.votes} renewed it'}"
            f", a quorum needs {self.quorum}; it keeps its validity ({self.validity:.3f} s left)"
        )


class LockLost(RedlockError):
    """The lease is no longer held on a quorum: it ended.

    Raised by ``Lease.check``, ``Lease.extend`` and ``Lease.release``. After this error another
    client may hold the lock: work done under the lease must be treated as possibly concurrent.
    A renewal that merely failed to reach a quorum is not a loss (:class:`LeaseNotExtended`):
    a lease ends only when its validity runs out, or when a quorum of nodes says so.

    Attributes:
        name: the lock name.
        reason: what happened, in words (counts of nodes that renewed, refused, or did not
            answer, where a round found it).
        cause: ``"expired"`` (its validity ran out, with or without failed renewals),
            ``"taken"`` (a quorum of nodes holds it for another token), ``"gone"`` (a quorum
            of nodes no longer holds it: force-released, or the nodes lost it), or ``""``
            when not known (an error rebuilt from an older message).
        at: when the lease ended, seconds on the manager's monotonic clock (for
            ``"expired"``, the instant its validity ran out; otherwise when a round found
            it), or None when not known.
    """

    def __init__(self, name: str, reason: str, cause: str = "", at: float | None = None) -> None:
        self.name = name
        self.reason = reason
        self.cause = cause
        self.at = at
        super().__init__(name, reason, cause, at)
        self._text = f"lock {name!r} lost: {reason}"


class LeaseReleased(RedlockError):
    """The lease was already released by this process; it cannot be used again."""

    def __init__(self, name: str) -> None:
        self.name = name
        super().__init__(name)
        self._text = f"lease on {name!r} was already released"


class LeaseInherited(RedlockError):
    """The lease belongs to another process: this one inherited it through ``fork()``.

    A lease is owned by the process that acquired it. A forked child (multiprocessing,
    gunicorn ``--preload``, ``os.fork``) gets a copy of the lease object but not the lease:
    releasing or extending it there would delete or renew the parent's keys while the parent
    still relies on them. ``release()``, ``extend()`` and ``check()`` raise this in the child;
    leaving an inherited ``with`` block there does nothing (see ``Lease.__exit__``).

    Attributes:
        name: the lock name.
        owner_pid: the process that holds the lease.
        pid: the process that inherited it (and raised this).
    """

    def __init__(self, name: str, owner_pid: int, pid: int) -> None:
        self.name = name
        self.owner_pid = owner_pid
        self.pid = pid
        super().__init__(name, owner_pid, pid)
        self._text = (
            f"lease on {name!r} belongs to process {owner_pid}; process {pid} inherited it "
            "through fork() and may not release, extend or check it"
        )


class StaleFencingToken(RedlockError):
    """A fenced write was refused because a newer holder minted a higher fencing token.

    Attributes:
        name: the lock name.
        token: the fencing token the refused write carried.
    """

    def __init__(self, name: str, token: int, detail: str = "") -> None:
        self.name = name
        self.token = token
        message = f"write under {name!r} with fencing token {token} refused: a newer holder exists"
        if detail:
            message += f" ({detail})"
        super().__init__(name, token, detail)
        self._text = message


class FencingUnavailable(RedlockError):
    """A fencing token could not be minted: the row does not exist, is not visible to a
    separate transaction, or stayed locked. The lock was released again."""


class UnfencedWrite(RedlockError):
    """A model with ``fencing_required = True`` was saved or deleted outside ``lock_for``."""
