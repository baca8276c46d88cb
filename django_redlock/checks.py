"""System checks for ``REDLOCK``: ids ``django_redlock.E001``… and ``W001``…, no network I/O.

The problems come from :func:`django_redlock.conf.inspect`, which checks each key with the
core's own argument checks (the limits below are the ``LockManager``'s).

| id | problem |
| --- | --- |
| E001 | REDLOCK is not a dict |
| E002 | REDLOCK has unknown keys (typos) |
| E003 | NODES missing, empty or not a list |
| E004 | a node is a bad URL, an unknown or non-Redis cache alias, or a malformed dict |
| E005 | the same node is listed twice, or two databases of one server |
| E006 | TTL is not seconds in (0, 86400], or no longer than NODE_TIMEOUT plus the drift |
| E007 | DRIFT_FACTOR is outside [0, 0.5) |
| E008 | NODE_TIMEOUT is not positive, or above a tenth of the TTL |
| E009 | RETRY_DELAY is not positive |
| E010 | KEY_PREFIX is not a str |
| E011 | DEFAULT_TIMEOUT is not seconds >= 0 or None |
| E012 | MAX_TTL is neither None nor a valid TTL at least as long as TTL |
| E013 | METRICS_LABEL is neither "prefix" nor "name" |
| E014 | a Sentinel node is malformed (no SERVICE, no Sentinel, a bad Sentinel URL, unknown keys) |
| E015 | a node's REPLICA_ACKS (or `?replica_acks=` in its URL) is not a number >= 1 |
| W001 | an even number of nodes |
| W002 | a single node (fine for development) |
| W003 | a node password inside a URL (shown on DEBUG error pages) |
| W004 | the old name TIMEOUT instead of DEFAULT_TIMEOUT |
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.core.checks import CheckMessage, Error, Warning

from django_redlock.conf import check_hint, inspect

__all__ = ["check_settings"]


def check_settings(**kwargs: Any) -> list[CheckMessage]:
    """Report every problem of ``settings.REDLOCK`` (registered in ``AppConfig.ready``)."""
    if not hasattr(settings, "REDLOCK"):
        return [
            Error(
                "REDLOCK is not set: django_redlock has no nodes to lock on",
                hint=check_hint("django_redlock.E003", 'REDLOCK = {"NODES": ["redis://...", ...]}'),
                id="django_redlock.E003",
            )
        ]
    _, problems = inspect(settings.REDLOCK, getattr(settings, "CACHES", {}))
    messages: list[CheckMessage] = []
    for problem in problems:
        message = Error if problem.level == "error" else Warning
        messages.append(message(problem.message, hint=problem.hint, id=problem.id))
    return messages
