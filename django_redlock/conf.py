"""The ``REDLOCK`` setting: one parser, used by the runtime and by the system checks.

Settings are read lazily (never at import) and the parsed result is dropped whenever Django
sends ``setting_changed`` for ``REDLOCK`` or ``CACHES``, so ``override_settings`` just works.

Every key is declared once, in :data:`SETTINGS`: its name, type, default, check id, the
:class:`~django_redlock.LockManager` argument it feeds and its documentation. Its value is
checked by the very function the core applies to that argument
(:mod:`django_redlock.procedures.arguments`), naming the setting instead of the argument, so a
setting and the matching ``LockManager(...)`` argument are refused with the same words and the
same limits.

A node is one of::

    "redis://host:6379/0"                                   # a URL (also rediss://, unix://)
    {"URL": "redis://host:6379/0", "PASSWORD": "...", "USERNAME": "..."}
    {"CACHE": "default"}                                    # a django-redis / Django cache alias
    {"SENTINELS": ["redis://s1:26379", "redis://s2:26379"], "SERVICE": "locks-1",
     "PASSWORD": "...", "SENTINEL_PASSWORD": "..."}         # the master of a Sentinel service

The dict form keeps the password out of the URL: Django's DEBUG error page cleanses dict keys
named like ``PASSWORD`` but shows strings inside lists as they are (a password embedded in a
URL would be readable there; check ``django_redlock.W003`` says so).
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

from django_redlock.node_settings import check_nodes
from django_redlock.procedures.arguments import (
    DEFAULT_MAX_TTL,
    MAX_DRIFT_FACTOR,
    MAX_TTL,
    check_drift_factor,
    check_key_prefix,
    check_max_ttl,
    check_seconds,
    check_timeout,
    check_ttl,
)
from django_redlock.redlock import (
    DEFAULT_DRIFT_FACTOR,
    DEFAULT_NODE_TIMEOUT,
    DEFAULT_RETRY_DELAY,
    DEFAULT_TIMEOUT,
    DEFAULT_TTL,
)
from django_redlock.wire.nodes import NodeAddress

__all__ = [
    "DEFAULTS",
    "SETTINGS",
    "Problem",
    "RedlockSettings",
    "Setting",
    "forget_settings",
    "get_settings",
    "inspect",
    "setting_name",
    "settings_reference",
]

_METRICS_LABELS = ("prefix", "name")
# A node must answer well within the lease: a slow node may cost at most this share of the TTL.
# A rule of the settings only; the core refuses just a ttl that one attempt could use up.
_NODE_TIMEOUT_SHARE = 0.1
# Old key names still read (with check W004) and the key that replaced each.
_RENAMED = {"TIMEOUT": "DEFAULT_TIMEOUT"}


@dataclass(frozen=True)
class Problem:
    """One thing wrong with the setting: the system checks report these as they are."""

    id: str
    level: Literal["error", "warning"]
    message: str
    hint: str | None = None


@dataclass(frozen=True)
class RedlockSettings:
    """The parsed ``REDLOCK`` setting (times in seconds)."""

    nodes: tuple[NodeAddress, ...]
    ttl: float
    node_timeout: float
    retry_delay: float
    drift_factor: float
    key_prefix: str
    timeout: float | None = DEFAULT_TIMEOUT
    max_ttl: float | None = None
    metrics_label: str = "prefix"
    problems: tuple[Problem, ...] = field(default=())

    def manager_options(self) -> dict[str, Any]:
        """The :class:`~django_redlock.LockManager` arguments these settings give."""
        return {
            setting.argument: getattr(self, setting.attribute)
            for setting in SETTINGS
            if setting.argument is not None
        }


def setting_name(argument: str) -> str:
    """How messages name the setting of a ``LockManager`` argument: ``REDLOCK['TTL']``."""
    return f"REDLOCK[{argument.upper()!r}]"


# Where the system checks are documented, for their hints: the page in the repository
# (mkdocs.yml's repo_url; the site has no site_url yet), which whoever installed the wheel can
# open, where a path into docs/ means something only in a clone. tests/django/test_checks.py
# keeps it in step with mkdocs.yml and with the page's headings.
CHECKS_PAGE = "https://github.com/django-redlock/django_redlock/blob/main/docs/reference/checks.md"


def check_hint(check_id: str, text: str) -> str:
    """``text``, then the address of ``check_id``'s entry on the checks page: the anchor
    that GitHub and MkDocs give its heading ``## `django_redlock.E001` `` (punctuation
    dropped, lower case)."""
    return f"{text} See {CHECKS_PAGE}#{check_id.replace('.', '').lower()}"


class _Reading:
    """One reading of a ``REDLOCK`` value: each key checked once, on demand, so a check may ask
    for another key's value (the TTL's floor depends on NODE_TIMEOUT) in any declared order."""

    def __init__(self, values: Mapping[str, object], caches: Mapping[str, Any]) -> None:
        self.values = values
        self.caches = caches
        self.problems: list[Problem] = []
        self._checked: dict[str, Any] = {}
        self._invalid: set[str] = set()

    def report(
        self, check_id: str, message: str, hint: str, level: Literal["error", "warning"] = "error"
    ) -> None:
        self.problems.append(Problem(check_id, level, message, check_hint(check_id, hint)))

    def value(self, key: str) -> Any:
        """The checked value of ``key``; None when it is invalid (its problem is reported)."""
        if key not in self._checked:
            setting = _BY_KEY[key]
            try:
                self._checked[key] = setting.check(self.values[key], setting.name, self)
            except (TypeError, ValueError) as exc:
                self._checked[key] = None
                self._invalid.add(key)
                self.report(setting.check_ids[0], str(exc), setting.hint)
        return self._checked[key]

    def valid(self, key: str) -> bool:
        self.value(key)
        return key not in self._invalid


Check = Callable[[object, str, _Reading], object]


@dataclass(frozen=True)
class Setting:
    """One ``REDLOCK`` key.

    Attributes:
        key: its name in the dict.
        type: its type, as documented.
        default: its value when absent.
        check: ``(value, name, reading) -> parsed``; raises ``TypeError``/``ValueError`` with
            a message naming ``name`` (the core's argument checks, given the setting's name).
        check_ids: the system check ids it can raise; the first one reports a refused value.
        hint: what to do when it is refused.
        doc: its Markdown documentation (docs/reference/settings.md).
        required: the setting is useless without it (documented as having no default).
        attribute: the :class:`RedlockSettings` field it fills (default: the key in lower case).
        argument: the :class:`~django_redlock.LockManager` argument it feeds (default: the key
            in lower case; None: it feeds none).
    """

    key: str
    type: str
    default: object
    check: Check
    check_ids: tuple[str, ...]
    hint: str
    doc: str
    required: bool = False
    attribute: str = ""
    argument: str | None = ""

    def __post_init__(self) -> None:
        for name in ("attribute", "argument"):
            if getattr(self, name) == "":
                object.__setattr__(self, name, self.key.lower())

    @property
    def name(self) -> str:
        """How messages name it: ``REDLOCK['TTL']``."""
        return setting_name(self.key)


# -- the other keys: the core's own argument checks, naming the setting ----------------------


def _check_ttl(value: object, name: str, reading: _Reading) -> float:
    node_timeout = reading.value("NODE_TIMEOUT")
    if (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and isinstance(node_timeout, int | float)
        and node_timeout >= 1
        and node_timeout > value * _NODE_TIMEOUT_SHARE
    ):
        # A node timeout of a second or more, out of scale with this TTL, is most likely
        # milliseconds (50 for 0.05): E008 names NODE_TIMEOUT, the setting to fix, instead of
        # blaming the TTL here.
        node_timeout = 0.0
    return check_ttl(
        value,
        name,
        node_timeout=node_timeout,
        drift_factor=reading.value("DRIFT_FACTOR") or 0.0,
        spell=setting_name,
    )


def _check_max_ttl(value: object, name: str, reading: _Reading) -> float | None:
    if value is None:  # the core's default, max(TTL, 60), which the manager computes
        return None
    return check_max_ttl(
        value,
        reading.value("TTL"),
        name,
        node_timeout=reading.value("NODE_TIMEOUT"),
        drift_factor=reading.value("DRIFT_FACTOR") or 0.0,
        spell=setting_name,
    )


def _check_metrics_label(value: object, name: str, reading: _Reading) -> str:
    if value not in _METRICS_LABELS:
        raise ValueError(f"{name} must be 'prefix' or 'name', not {value!r}")
    return str(value)


def _node_timeout_within_ttl(reading: _Reading) -> None:
    """E008's second half: a slow node may cost only a small part of the lease."""
    if not (reading.valid("NODE_TIMEOUT") and reading.valid("TTL")):
        return
    node_timeout, ttl = reading.value("NODE_TIMEOUT"), reading.value("TTL")
    if node_timeout > ttl * _NODE_TIMEOUT_SHARE:
        reading.report(
            "django_redlock.E008",
            f"REDLOCK['NODE_TIMEOUT'] ({node_timeout:g} s) must be well below the TTL "
            f"({ttl:g} s): at most a tenth of it",
            "Seconds, not milliseconds: for 50 ms write 0.05 (the default)."
            if node_timeout >= 1
            else "A slow node must cost a small part of the lease (the default is 0.05 s).",
        )


def _alone(check: Callable[[object, str], object]) -> Check:
    """A check of the value alone: one of the core's argument checks, as it is."""
    return lambda value, name, reading: check(value, name)


def _check_node_list(value: object, name: str, reading: _Reading) -> tuple[NodeAddress, ...]:
    """E003 says what it got (issue 40, item 9): a single URL string is the usual slip. The
    value itself is not repeated: a URL may carry a password."""
    if isinstance(value, str):
        raise TypeError(
            f"{name} must be a list of node URLs, got a str (one URL?): write "
            f'{name} = ["redis://..."], with the brackets'
        )
    if not isinstance(value, list | tuple):
        got = "None" if value is None else f"a {type(value).__name__}"
        raise TypeError(f"{name} must be a list of node URLs, got {got}")
    return check_nodes(value, name, reading)


_NODES_DOC = """\
The independent Redis/Valkey masters, 3 or 5 of them. Each is one of:

- a URL: `"redis://host:6379/0"`, `"rediss://host:6380/0?ssl_ca_certs=/etc/ca.pem"`,
  `"unix:///run/redis.sock?db=0"`;
- `{"URL": "...", "PASSWORD": "...", "USERNAME": "..."}`: the password stays out of the URL.
  Django's DEBUG error page cleanses dict keys named `PASSWORD` but shows strings inside lists
  as they are, so a password inside a URL would be readable there (check W003 warns);
- `{"CACHE": "alias"}`: the server of a cache in `CACHES` whose backend is
  `django_redis.cache.RedisCache` or `django.core.cache.backends.redis.RedisCache`. Its first
  `LOCATION` is used (django-redis lists replicas after the master: they never count as nodes)
  and its `OPTIONS["PASSWORD"]`. Its client options, retries included, are not: the lock uses
  its own connections with one try per node;
- `{"SENTINELS": ["redis://s1:26379", "redis://s2:26379"], "SERVICE": "locks-1"}`: the master
  of a service that Sentinels monitor, asked of them (in turn, within `NODE_TIMEOUT`) when a
  connection opens, and again after a connection loss or a reply from a replica. One node is
  one service: list N services for N nodes. Optional keys: `PASSWORD` and `USERNAME` (the
  master's login), `DB`, `TLS` (`True`: TLS to the master) and `SSL_OPTIONS` (`ssl_*` names
  as in a `rediss://` query, for the master and for `rediss://` Sentinels whose URL gives
  none), `SENTINEL_PASSWORD` and `SENTINEL_USERNAME` (the Sentinels' login). A Sentinel URL is
  `redis://host:port` or `rediss://host:port`, nothing more (check E014). `LockManager(nodes=...)`
  takes the same dict.

Any dict above may also say `"REPLICA_ACKS": N` (a URL: `?replica_acks=N`, which
`LockManager(nodes=[...])` takes too), for a node that is a master with replicas: a grant or
renewal there counts only once `WAIT` confirms that at least N replicas, and every replica
online, have it, so a replica promoted in a failover votes at once instead of sitting out the
quarantine. N >= 1 (check E015); every client of the node must set it. See
[deploying](../howto/deploying.md#replicas-sentinel-and-managed-redis)."""
_DEFAULT_TIMEOUT_DOC = f"""\
How long a blocking acquire waits when not told: `get_manager().acquire()` and `.lock()`,
`lock_for`, and `@locked_command(on_busy="wait")`. Finite by default, so a lock that never comes
free (or a quorum that is down) surfaces as an error, not as a hung worker; `None` waits
forever (discouraged), and so does `timeout=None` passed explicitly. The core's
`LockManager(default_timeout={DEFAULT_TIMEOUT!r})` is the same default outside Django."""
_MAX_TTL_DOC = f"""\
The longest lease any acquire may ask for (`None`: `max(TTL, {DEFAULT_MAX_TTL:g})`), and \
therefore the **restart
quarantine**: a node that lost its data votes again only this long after it came back (see
[guarantees](../explanation/guarantees.md))."""

# One row per key: name, type, default, check, check ids; then what to do and the docs.
# fmt: off
SETTINGS: tuple[Setting, ...] = (
    Setting("NODES", "list[str | dict]", [], _check_node_list, (
                "django_redlock.E003", "django_redlock.E004", "django_redlock.E005",
                "django_redlock.E014", "django_redlock.E015",
                "django_redlock.W001", "django_redlock.W002", "django_redlock.W003",
            ),
            required=True,
            hint="Three or five independent Redis/Valkey masters.",
            doc=_NODES_DOC),
    Setting("TTL", "float", DEFAULT_TTL, _check_ttl, ("django_redlock.E006",),
            hint="Seconds, as a number.",
            doc=f"Default lease length, `0 < TTL ≤ {MAX_TTL:g}`."),
    Setting("NODE_TIMEOUT", "float", DEFAULT_NODE_TIMEOUT, _alone(check_seconds),
            ("django_redlock.E008",),
            hint="A slow node must cost a small part of the lease (the default is 0.05 s).",
            doc="Seconds each node has to answer one command. A slower node is a failed vote. "
            "At most a tenth of\n`TTL`. When the nodes share a small machine with busy workers "
            "(a development box, one VM for\neverything), healthy nodes now and then miss 50 ms: "
            "measured at about 1 failed acquire in\n8,000 with 4 processes of 8 threads on 2 "
            "cores, none at 100 ms (W7 on the benchmarks page);\nset `0.1` there. It is also "
            "the longest a stalled node adds to an acquire that needs it."),
    Setting("RETRY_DELAY", "float", DEFAULT_RETRY_DELAY, _alone(check_seconds),
            ("django_redlock.E009",),
            hint="Seconds between attempts, as a positive number.",
            # \N{EN DASH}: ruff refuses the literal character as ambiguous.
            doc="Mean wait between attempts of a blocking acquire; each wait is jittered to "
            "50\N{EN DASH}150 %."),
    Setting("DRIFT_FACTOR", "float", DEFAULT_DRIFT_FACTOR, _alone(check_drift_factor),
            ("django_redlock.E007",),
            hint="The Redlock spec uses 0.01.",
            doc="Share of the ttl set aside for clock drift between nodes (the Redlock spec's "
            f"value), in\n`[0, {MAX_DRIFT_FACTOR:g})`."),
    Setting("KEY_PREFIX", "str", "redlock:", _alone(check_key_prefix), ("django_redlock.E010",),
            hint="Any text, possibly empty.",
            doc="Prepended to every lock name to make its Redis key."),
    Setting("DEFAULT_TIMEOUT", "float | None", DEFAULT_TIMEOUT, _alone(check_timeout),
            ("django_redlock.E011", "django_redlock.W004"),
            attribute="timeout",
            hint="None makes acquires wait forever (discouraged).",
            doc=_DEFAULT_TIMEOUT_DOC),
    Setting("MAX_TTL", "float | None", None, _check_max_ttl, ("django_redlock.E012",),
            hint="It is the longest lease allowed and the restart quarantine of a node.",
            doc=_MAX_TTL_DOC),
    Setting("METRICS_LABEL", "str", "prefix", _check_metrics_label, ("django_redlock.E013",),
            argument=None,
            hint="'prefix' keeps the number of series low.",
            doc='The `lock` label of the Prometheus series: `"prefix"` (the name up to its first '
            '`:`, so\n`orders:42` counts as `orders`, keeping cardinality low) or `"name"`.'),
)
# fmt: on
"""Every ``REDLOCK`` key, in the order docs/reference/settings.md documents them."""

_BY_KEY = {setting.key: setting for setting in SETTINGS}
# Rules across keys, run on valid values only, each reporting under the id of the key it blames.
_RULES: tuple[Callable[[_Reading], None], ...] = (_node_timeout_within_ttl,)

DEFAULTS: dict[str, Any] = {setting.key: setting.default for setting in SETTINGS}
"""Every ``REDLOCK`` key and its default."""


def inspect(
    raw: object, caches: Mapping[str, Any] | None = None
) -> tuple[RedlockSettings | None, list[Problem]]:
    """Parse a ``REDLOCK`` value; return the settings (None if unusable) and every problem.

    Does no network I/O. The system checks report the problems; the runtime refuses to start
    on any error-level one.
    """
    if not isinstance(raw, Mapping):
        problem = Problem(
            "django_redlock.E001",
            "error",
            f"REDLOCK must be a dict, not {type(raw).__name__}",
            check_hint("django_redlock.E001", 'REDLOCK = {"NODES": ["redis://...", ...]}'),
        )
        return None, [problem]
    values = dict(raw)
    renamed: list[tuple[str, str]] = []
    for old, new in _RENAMED.items():
        if old in values:
            values.setdefault(new, values.pop(old))
            renamed.append((old, new))
    reading = _Reading({**DEFAULTS, **values}, {} if caches is None else caches)
    for old, new in renamed:
        reading.report(
            "django_redlock.W004",
            f"REDLOCK[{old!r}] is now called REDLOCK[{new!r}] (it is also the default of "
            "LockManager.acquire and lock)",
            "Rename the key.",
            "warning",
        )
    unknown = sorted(str(key) for key in values if key not in DEFAULTS)
    if unknown:
        reading.report(
            "django_redlock.E002",
            f"REDLOCK has unknown keys: {', '.join(unknown)}",
            f"Known keys: {', '.join(DEFAULTS)}.",
        )
    parsed = {setting.attribute: reading.value(setting.key) for setting in SETTINGS}
    for rule in _RULES:
        rule(reading)
    problems = reading.problems
    if any(problem.level == "error" for problem in problems):
        return None, problems
    return RedlockSettings(**parsed, problems=tuple(problems)), problems


def settings_reference() -> str:
    """docs/reference/settings.md (Markdown), one heading per key, from :data:`SETTINGS`."""
    sections = []
    for setting in SETTINGS:
        ids = ", ".join(check_id.rsplit(".", 1)[1] for check_id in setting.check_ids)
        checks = f"check{'s' if len(setting.check_ids) > 1 else ''} {ids}"
        if setting.required:
            heading = f"`{setting.key}: {setting.type}` (no default; {checks})"
        else:
            default = (
                f'"{setting.default}"' if isinstance(setting.default, str) else setting.default
            )
            heading = f"`{setting.key}: {setting.type} = {default}` ({checks})"
        sections.append(f"## {heading}\n\n{setting.doc}\n")
    return "\n".join(sections)


# -- the parsed settings: read on first use, dropped on setting_changed ---------------------

_settings: RedlockSettings | None = None


def get_settings() -> RedlockSettings:
    """The current parsed settings (parsed on first use after each change).

    Raises:
        ImproperlyConfigured: ``REDLOCK`` has an error (the same text the system check shows).
    """
    global _settings
    if _settings is None:
        parsed, problems = inspect(
            getattr(settings, "REDLOCK", {}), getattr(settings, "CACHES", {})
        )
        if parsed is None:
            errors = [problem for problem in problems if problem.level == "error"]
            raise ImproperlyConfigured(
                "; ".join(f"{problem.message} ({problem.id})" for problem in errors)
            )
        _settings = parsed
    return _settings


def forget_settings() -> None:
    """Drop the parsed settings: the next :func:`get_settings` reads them again."""
    global _settings
    _settings = None


# The process-wide manager and its factory lived here until they moved to default_manager
# (the settings' parser and the singleton are two jobs); the old path still works, and says
# where the name went. By name, as the package root's lazy names are: default_manager
# imports this module, and this one must not import it back (no import cycle, not even a
# late one: tests/test_module_boundaries.py). Type checkers see the names gone.
_MOVED = dict.fromkeys(
    (
        "ManagerFactory",
        "build_manager",
        "get_async_manager",
        "get_manager",
        "reset",
        "set_manager_factory",
    ),
    "django_redlock.default_manager",
)

if not TYPE_CHECKING:

    def __getattr__(name: str) -> Any:
        """``django_redlock.conf.<name>`` for a name that moved to
        :mod:`django_redlock.default_manager`: that object, with a ``DeprecationWarning``.

        Raises:
            AttributeError: for any other name.
        """
        module = _MOVED.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        warnings.warn(
            f"django_redlock.conf.{name} moved: from {module} import {name}",
            DeprecationWarning,
            stacklevel=2,
        )
        return getattr(importlib.import_module(module), name)
