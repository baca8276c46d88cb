"""Argument checks shared by the core and the Django settings (``conf.py``): one definition of
what a valid number of seconds, lock name or origin is, so a setting and an argument are
refused with the same words.

Raises ``TypeError``/``ValueError`` naming the argument; imports no Django.
"""

from __future__ import annotations

import decimal
import math
import numbers
import re
import unicodedata
from collections.abc import Callable

from django_redlock.wire.primitives import MAX_MANY

__all__ = [
    "DEFAULT_MAX_TTL",
    "DRIFT_SECONDS",
    "MAX_DRIFT_FACTOR",
    "MAX_NAME_BYTES",
    "MAX_ORIGIN_BYTES",
    "MAX_TTL",
    "check_drift_factor",
    "check_key_prefix",
    "check_max_ttl",
    "check_seconds",
    "check_timeout",
    "check_ttl",
    "clip_origin",
    "clip_text",
    "validate_name",
    "validate_names",
]

MAX_TTL = 86400.0
"""Longest lease accepted, in seconds (one day): longer is almost surely a unit mistake."""
DEFAULT_MAX_TTL = 60.0
"""``max_ttl`` when none is given, in seconds (raised to the ttl when that is longer): the
restart quarantine, so short enough that a restarted node soon votes again."""
MAX_DRIFT_FACTOR = 0.5
"""``drift_factor`` must stay below this: at 0.5 the drift term eats half of every lease."""
DRIFT_SECONDS = 0.002
"""Seconds the Redlock spec adds to the drift term for the resolution of the nodes' expiry
clocks: validity is ``ttl - elapsed - (ttl * drift_factor + DRIFT_SECONDS)``."""

MAX_NAME_BYTES = 1024
"""Longest lock name accepted, in UTF-8 bytes: huge keys stall a node for everyone."""
MAX_ORIGIN_BYTES = 1024
"""Longest ``origin`` kept, in UTF-8 bytes; a longer one is cut and ends in ``…``. It is
stored on every node with every lock, so its size is everybody's memory and bandwidth."""
# Unicode category Cc is exactly these two ranges.
_CONTROL_CHARACTERS = re.compile("[\x00-\x1f\x7f-\x9f]")
# Ends a text that was cut to fit its byte budget (3 UTF-8 bytes).
_CUT = "\u2026"
_CUT_BYTES = len(_CUT.encode("utf-8"))


def check_seconds(value: object, argument: str, *, allow_zero: bool = False) -> float:
    """A finite, non-negative number of seconds as a float, or a clear error naming
    ``argument``.

    Any real number is accepted (``int``, ``float``, ``Decimal``, ``Fraction``, numpy
    scalars: :class:`numbers.Real` or :class:`decimal.Decimal`), except ``bool``.

    Raises:
        TypeError: not a real number, or a bool.
        ValueError: NaN, infinite, too large for a float, negative, or zero when not allowed.
    """
    if type(value) is float:  # the common case, without an ABC check
        number = value
    else:
        if type(value) is not int and (
            isinstance(value, bool) or not isinstance(value, numbers.Real | decimal.Decimal)
        ):
            raise TypeError(
                f"{argument} must be a number of seconds, not {type(value).__name__} (any real "
                "number: int, float, Decimal, Fraction; not bool)"
            )
        try:
            number = float(value)  # a Real or Decimal: checked above
        except (ArithmeticError, ValueError):  # too large for a float; a signalling NaN
            raise ValueError(
                f"{argument} must be a finite number of seconds, not {value!r}"
            ) from None
    if math.isnan(number) or math.isinf(number):
        raise ValueError(f"{argument} must be a finite number of seconds, not {value!r}")
    if number < 0 or (number == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise ValueError(f"{argument} must be {bound} seconds, not {value!r}")
    return number


def _as_is(argument: str) -> str:
    return argument


def check_ttl(
    value: object,
    argument: str = "ttl",
    *,
    max_ttl: float = MAX_TTL,
    node_timeout: float | None = None,
    drift_factor: float = 0.0,
    spell: Callable[[str], str] = _as_is,
) -> float:
    """A lease length in seconds, or a clear error naming ``argument``.

    Args:
        value: the lease length asked for.
        argument: how messages name it (``"ttl"``, or a setting such as ``REDLOCK['TTL']``).
        max_ttl: the manager's longest lease (at most :data:`MAX_TTL`).
        node_timeout: seconds one attempt may cost; when given, the lease must outlive it plus
            the drift, or its validity could never be positive.
        drift_factor: the manager's share of the ttl set aside for clock drift.
        spell: how messages name the other arguments they mention (``max_ttl``,
            ``node_timeout``); the Django settings spell them as settings.

    Raises:
        TypeError: not a real number, or a bool.
        ValueError: not positive and finite, above :data:`MAX_TTL` or ``max_ttl``, or too
            short for ``node_timeout``.
    """
    seconds = check_seconds(value, argument)
    if seconds > MAX_TTL:
        raise ValueError(f"{argument}={value!r} is above the cap of {MAX_TTL:g} seconds")
    if seconds > max_ttl:
        name = spell("max_ttl")
        # The runtime check (acquire's ttl) names the argument; a Django user set it as a
        # setting, so the message says both (issue 40, item 9).
        where = " (REDLOCK['MAX_TTL'] in Django)" if spell is _as_is else ""
        raise ValueError(
            f"{argument}={value!r} is above {name}={max_ttl:g}, the restart quarantine: "
            f"raise {name}{where} to take longer leases"
        )
    if node_timeout is not None:
        floor = node_timeout + seconds * drift_factor + DRIFT_SECONDS
        if seconds <= floor:
            raise ValueError(
                f"{argument}={value!r} is too short: with {spell('node_timeout')}="
                f"{node_timeout:g} the lease must be longer than {floor:.3f} seconds"
            )
    return seconds


def check_max_ttl(
    value: object,
    ttl: float | None,
    argument: str = "max_ttl",
    *,
    node_timeout: float | None = None,
    drift_factor: float = 0.0,
    spell: Callable[[str], str] = _as_is,
) -> float:
    """The longest lease a manager grants (its restart quarantine), in seconds.

    ``None`` means :data:`DEFAULT_MAX_TTL`, or ``ttl`` when that is longer. Otherwise the
    value is checked as a ttl (:func:`check_ttl`) and must be at least ``ttl`` (the manager's
    default lease; ``None`` when unknown skips that comparison).

    Raises:
        TypeError, ValueError: as :func:`check_ttl`, or ``ttl`` is above it.
    """
    if value is None:
        return DEFAULT_MAX_TTL if ttl is None else max(ttl, DEFAULT_MAX_TTL)
    seconds = check_ttl(
        value, argument, node_timeout=node_timeout, drift_factor=drift_factor, spell=spell
    )
    if ttl is not None and ttl > seconds:
        raise ValueError(f"{spell('ttl')}={ttl:g} is above {argument}={value!r}")
    return seconds


def check_drift_factor(value: object, argument: str = "drift_factor") -> float:
    """The share of the ttl set aside for clock drift, in ``[0, MAX_DRIFT_FACTOR)`` (the
    Redlock spec uses 0.01).

    Raises:
        TypeError: not a real number, or a bool.
        ValueError: negative, not finite, or :data:`MAX_DRIFT_FACTOR` or more.
    """
    factor = check_seconds(value, argument, allow_zero=True)
    if factor >= MAX_DRIFT_FACTOR:
        raise ValueError(f"{argument} must be below {MAX_DRIFT_FACTOR:g}, not {value!r}")
    return factor


def check_timeout(value: object, argument: str = "default_timeout") -> float | None:
    """How long a blocking acquire waits, in seconds: zero or more, or ``None`` (forever).

    Raises:
        TypeError, ValueError: as :func:`check_seconds` with zero allowed.
    """
    return None if value is None else check_seconds(value, argument, allow_zero=True)


def check_key_prefix(value: object, argument: str = "key_prefix") -> str:
    """The text put before every lock name to form its Redis key (may be empty).

    Raises:
        TypeError: not a ``str``.
    """
    if not isinstance(value, str):
        raise TypeError(f"{argument} must be a str, not {type(value).__name__}")
    return value


def clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most ``limit`` UTF-8 bytes, ending in ``…`` when it was cut (never
    in the middle of a character; lone surrogates in a cut text are dropped)."""
    if len(text) * 4 <= limit:  # the common case: short enough whatever its characters
        return text
    encoded = text[: limit + 1].encode("utf-8", "surrogatepass")
    if len(encoded) <= limit and len(text) <= limit:
        return text
    return encoded[: limit - _CUT_BYTES].decode("utf-8", "ignore") + _CUT


def clip_origin(origin: str | None) -> str | None:
    """The ``origin`` as kept and stored: at most :data:`MAX_ORIGIN_BYTES` UTF-8 bytes (a
    ``str`` subclass's text as a plain ``str``: its instance may carry anything)."""
    if origin is None:
        return None
    if type(origin) is not str and isinstance(origin, str):
        origin = str.__str__(origin)
    return clip_text(origin, MAX_ORIGIN_BYTES)


def validate_name(name: object) -> str:
    """The lock name, NFC-normalised, or a clear error.

    Names are text: visually equal Unicode names map to one lock (NFC), control characters
    are refused (they break logs and pages), and the length is capped.

    Raises:
        TypeError: ``name`` is not a ``str``.
        ValueError: empty, longer than :data:`MAX_NAME_BYTES`, or holds control characters.
    """
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, not {type(name).__name__}")
    if type(name) is not str:  # a subclass's instance may carry anything: keep its text only
        name = str.__str__(name)
    if not name:
        raise ValueError("name must not be empty")
    if name.isascii():  # the common case: already NFC, one byte per character
        size = len(name)
        # An ASCII text is printable exactly when it has none of _CONTROL_CHARACTERS (its
        # ASCII ones are 0x00-0x1f and 0x7f): one scan in C on every acquire, no regex
        # (tests/core/test_arguments.py checks the two agree on every ASCII character).
        clean = name.isprintable()
    else:
        name = unicodedata.normalize("NFC", name)
        try:
            size = len(name.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValueError("name must be valid Unicode (it has a lone surrogate)") from None
        clean = False
    if size > MAX_NAME_BYTES:
        raise ValueError(f"name is {size} bytes long; the limit is {MAX_NAME_BYTES} UTF-8 bytes")
    if not clean and _CONTROL_CHARACTERS.search(name):
        raise ValueError(f"name must not contain control characters: {name!r}")
    return name


def validate_names(names: object) -> list[str]:
    """The names of a multi-lock, each checked as :func:`validate_name`, NFC-normalised,
    sorted, each once (``lock_many``).

    Raises:
        TypeError: ``names`` is a single ``str`` or not iterable, or holds a non-``str``.
        ValueError: a bad name (the message says which, by position).
    """
    if isinstance(names, str | bytes):
        raise TypeError(f"names must be an iterable of names, not a single {type(names).__name__}")
    try:
        given = iter(names)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"names must be an iterable of str, not {type(names).__name__}") from None
    checked: set[str] = set()
    for index, name in enumerate(given):  # an error raised by a generator itself propagates
        try:
            checked.add(validate_name(name))
        except TypeError as error:
            raise TypeError(f"names[{index}]: {error}") from None
        except ValueError as error:
            raise ValueError(f"names[{index}]: {error}") from None
        if len(checked) > MAX_MANY:  # before an endless iterable fills the memory
            raise ValueError(f"names: at most {MAX_MANY} locks at once")
    return sorted(checked)
