"""``manage.py redlock_status [--json] [--prefix P] [--limit N|all]``: node health, quorum,
active locks.

Exit status 0 when a quorum of nodes can vote now and no node is misconfigured, 1 otherwise, so
it serves as a health check: a node that answers with a refusal (a db index out of range, a
login or ACL refused, a replica, the same server twice) never heals by waiting, so it fails the
check even while the others make a quorum; a node that does not answer may come back, and fails
it only when the quorum is lost. Each node's verdict (votes / quarantined until T / down /
misconfigured) comes from the rule the acquire script applies. The nodes are probed at once, so
the command is bounded by about one ``--timeout`` whatever number of nodes is stopped or
paused. At most ``--limit`` locks are listed (the first by name, 1,000 by default); when more
exist, the output says "showing N of about M" and how many it did not show. A lock is "partial"
only when fewer than a quorum of nodes hold it (a leftover), never because of the limit.

The ``--json`` output is a stable schema::

    {"healthy": bool, "quorum": int, "voting": int,
     "nodes": [{"node": str, "reachable": bool, "votes": bool, "latency_ms": float|null,
                "server": str|null, "version": str|null, "role": str|null,
                "replicas": [str] ("host:port (state, lag N s)"), "master": str|null (a
                replica's master), "promoted": bool (a replica promoted in this process's
                life: it waits the quarantine from its promotion), "run_id": str|null,
                "uptime_s": int|null, "maxmemory": int|null,
                "maxmemory_policy": str|null, "persistence": str|null,
                "clock_offset_ms": float|null, "quarantine_left_s": float|null,
                "vote": "votes"|"quarantined"|"down", "vote_detail": str,
                "votes_at": float|null (epoch seconds),
                "problems": [str], "warnings": [str],
                "misconfigured": bool (answered with a refusal: never heals by waiting),
                "service": str|null (a node reached through Sentinel: the service name),
                "resolved": str|null (its master's "host:port" as the Sentinels told it;
                null when none answered),
                "shards": [{"master": str ("host:port"), "slots": str ("0-5460,…"),
                            "reachable": bool, "votes": bool, "role": str|null,
                            "replicas": [str], "promoted": bool, "run_id": str|null,
                            "uptime_s": int|null, "quarantine_left_s": float|null,
                            "vote": str, "vote_detail": str, "votes_at": float|null,
                            "problems": [str]}] (a cluster node's shards, each judged by
                            its own restart rule; the node votes when every shard does;
                            empty for a plain node)}],
     "locks": [{"name": str, "nodes": int, "total": int, "partial": bool,
                "ttl_min": float|null, "ttl_max": float|null, "owner": {...},
                "kind": "lock"|"semaphore"|"read", "slot": int|null}],
     "locks_truncated": bool, "locks_not_shown": int, "locks_approx_total": int,
     "locks_unreachable": [str] (nodes the locks could not be read from),
     "this_process": {"acquired": int, "contended": int, "quorum_unreachable": int,
                      "released": int, "extended": int, "lost": int, "node_error": int}}
    (counts of this process only; keys appear once the event happened; locks_approx_total:
    the locks listed plus the lock keys found and not listed, see LockListing.approx_total)
"""

from __future__ import annotations

import json
from argparse import ArgumentParser, ArgumentTypeError
from dataclasses import asdict
from datetime import datetime
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError

from django_redlock.core import metrics
from django_redlock.core.health import status
from django_redlock.core.listing import list_locks
from django_redlock.default_manager import get_manager


def _limit(text: str) -> int | None:
    """``--limit``: how many locks to list, a whole number of 1 or more, or "all"."""
    if text == "all":
        return None
    try:
        limit = int(text)
    except ValueError:
        raise ArgumentTypeError(f'not a whole number or "all": {text!r}') from None
    if limit < 1:
        raise ArgumentTypeError(f'must be 1 or more (or "all"), not {text}')
    return limit


def _timeout(text: str) -> float:
    """``--timeout``: a finite number of seconds, 0 < S <= 60 (argparse reports the error)."""
    try:
        seconds = float(text)
    except ValueError:
        raise ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < seconds <= 60:  # also refuses nan and inf
        raise ArgumentTypeError(f"must be above 0 and at most 60 seconds, not {text}")
    return seconds


class Command(BaseCommand):
    help = "Show every lock node's health, the quorum verdict and the active locks."
    # It must work as a health check even while other apps' checks fail.
    requires_system_checks: list[str] = []  # noqa: RUF012 - Django reads a plain list

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--json", action="store_true", help="print the stable JSON schema")
        parser.add_argument("--prefix", default="", help="only locks whose name starts so")
        parser.add_argument(
            "--limit",
            type=_limit,
            default=1000,
            help='list at most N locks, the first by name (default 1000), or "all"',
        )
        parser.add_argument(
            "--timeout",
            type=_timeout,
            default=0.25,
            help="seconds per command on each node (0 < S <= 60)",
        )

    def handle(
        self,
        *args: Any,
        json: bool,
        prefix: str,
        limit: int | None,
        timeout: float,
        **options: Any,
    ) -> None:
        try:
            manager = get_manager()
        except ImproperlyConfigured as exc:
            raise CommandError(f"REDLOCK is not usable: {exc}") from None
        report = status(manager, timeout=timeout)
        down = [node.node for node in report.nodes if not node.reachable]
        listing = list_locks(manager, prefix, limit=limit, timeout=timeout, skip=down)
        if json:
            payload = report.as_dict()
            payload["locks"] = [asdict(lock) for lock in listing.locks]
            payload["locks_truncated"] = listing.truncated
            payload["locks_not_shown"] = listing.not_shown
            payload["locks_approx_total"] = listing.approx_total
            payload["locks_unreachable"] = listing.unreachable
            payload["this_process"] = metrics.summary()
            self.stdout.write(_dumps(payload))
        else:
            self._print(report, listing)
        if not report.healthy:
            raise CommandError(
                f"no quorum: {report.voting} of {len(report.nodes)} nodes can vote, "
                f"{report.quorum} needed"
            )
        if report.misconfigured:
            raise CommandError(
                "misconfigured: "
                + "; ".join(f"{node.node}: {node.problems[0]}" for node in report.misconfigured)
            )

    def _print_sentinel(self, node: Any) -> None:
        """For a node reached through Sentinel: its service and the master they told."""
        if node.service is not None:
            master = node.resolved or "not told (no Sentinel answered)"
            self.stdout.write(f"    sentinel service {node.service}: master {master}")

    def _print_shards(self, node: Any) -> None:
        """For a cluster node: each shard's master, slots, role and vote (by its own rule)."""
        for shard in node.shards:
            if not shard.reachable:
                state = "DOWN"
            elif shard.vote == "quarantined":
                state = "QUARANTINED" + (
                    f" until {_clock(shard.votes_at)}" if shard.votes_at is not None else ""
                )
            elif shard.problems:
                state = "DOES NOT VOTE"
            else:
                state = "votes"
            role = (shard.role or "?") + (" (promoted)" if shard.promoted else "")
            if shard.replicas:
                count = len(shard.replicas)
                role += f", {count} replica{'s' if count != 1 else ''}"
            line = f"    shard {shard.master}  slots {shard.slots}  {state}  {role}"
            if shard.uptime_s is not None:
                line += f"  up {shard.uptime_s} s"
            style = self.style.SUCCESS if shard.votes else self.style.ERROR
            self.stdout.write(style(line))

    def _print(self, report: Any, listing: Any) -> None:
        self.stdout.write("Nodes:")
        for node in report.nodes:
            if not node.reachable:
                what = "MISCONFIGURED" if node.misconfigured else "DOWN"
                line = f"  {node.node}  {what}  {'; '.join(node.problems)}"
                self.stdout.write(self.style.ERROR(line))
                self._print_sentinel(node)
                continue
            state = "votes"
            if node.vote == "quarantined":
                state = "QUARANTINED" + (
                    f" until {_clock(node.votes_at)}" if node.votes_at is not None else ""
                )
            elif node.problems:
                state = "DOES NOT VOTE"
            role = node.role or "?"
            if node.promoted:
                role += " (promoted)"
            elif node.master:
                role += f" of {node.master}"
            if node.replicas:
                role += f", {len(node.replicas)} replica{'s' if len(node.replicas) != 1 else ''}"
            line = (
                f"  {node.node}  {state}  {node.server} {node.version}  {role}  "
                f"{node.latency_ms:.2f} ms  up {node.uptime_s} s  "
                f"clock {node.clock_offset_ms:+.0f} ms  {node.persistence}"
            )
            style = self.style.SUCCESS if node.votes else self.style.ERROR
            self.stdout.write(style(line))
            self._print_sentinel(node)
            self._print_shards(node)
            if node.vote == "quarantined":
                self.stdout.write(self.style.ERROR(f"    {node.vote_detail}"))
            for problem in node.problems:
                self.stdout.write(self.style.ERROR(f"    error: {problem}"))
            for warning in node.warnings:
                self.stdout.write(self.style.WARNING(f"    warning: {warning}"))
        verdict = (
            f"Quorum: {report.voting} of {len(report.nodes)} nodes vote, {report.quorum} needed"
        )
        if not report.healthy:
            self.stdout.write(self.style.ERROR(verdict + ": NO QUORUM"))
        elif report.misconfigured:
            count = len(report.misconfigured)
            self.stdout.write(
                self.style.ERROR(
                    f"{verdict}, but {count} node{'s' if count != 1 else ''} misconfigured: "
                    "fix the configuration (it does not heal by waiting)"
                )
            )
        else:
            self.stdout.write(self.style.SUCCESS(verdict + ": healthy"))
        if listing.truncated:
            self.stdout.write(
                f"Active locks: showing {len(listing.locks)} of about {listing.approx_total} "
                f"({listing.not_shown} not shown: use --limit or --prefix to see them)"
            )
        else:
            self.stdout.write(f"Active locks: {len(listing.locks)}")
        if listing.unreachable:
            # Otherwise a node that did not answer the listing looks like a node without locks.
            left_out = (
                "the node counts below leave it out"
                if listing.locks
                else "a lock held only there would not show here"
            )
            self.stdout.write(
                self.style.WARNING(f"  not read from {', '.join(listing.unreachable)}: {left_out}")
            )
        for lock in listing.locks:
            self.stdout.write("  " + "  ".join(_lock_columns(lock)))


def _lock_columns(lock: Any) -> list[str]:
    """One listed lock's columns: name, nodes holding it, time left, holder (with where it
    was taken when the owner record says), and whether it is a leftover. A column with
    nothing to say is left out, so no line ends in a blank."""
    owner = lock.owner
    holder = f"held by {owner.get('host', '?')} pid {owner.get('pid', '?')}"
    if owner.get("origin"):
        holder += f" in {owner['origin']}"
    columns = [
        lock.label,
        f"{lock.nodes}/{lock.total} nodes",
        f"{lock.ttl_min:.1f} s left" if lock.ttl_min is not None else "time left unknown",
        holder,
    ]
    if lock.partial:
        columns.append("(partial: leftover keys)")
    return columns


def _clock(epoch: float) -> str:
    """Local wall-clock time of day, to the second, with the time zone."""
    return datetime.fromtimestamp(epoch).astimezone().strftime("%H:%M:%S %Z")


def _dumps(payload: dict[str, Any]) -> str:
    return json.dumps(payload, indent=2, sort_keys=True, default=str)
