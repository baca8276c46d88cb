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

__all__ = [
    "MAX_NAME_BYTES",
    "MAX_ORIGIN_BYTES",
    "check_seconds",
    "clip_origin",
    "clip_text",
    "validate_name",
]

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
    """The ``origin`` as kept and stored: at most :data:`MAX_ORIGIN_BYTES` UTF-8 bytes."""
    return None if origin is None else clip_text(origin, MAX_ORIGIN_BYTES)


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
    if not name:
        raise ValueError("name must not be empty")
    if name.isascii():  # the common case: already NFC, one byte per character
        size = len(name)
    else:
        name = unicodedata.normalize("NFC", name)
        size = len(name.encode("utf-8"))
    if size > MAX_NAME_BYTES:
        raise ValueError(f"name is {size} bytes long; the limit is {MAX_NAME_BYTES} UTF-8 bytes")
    if _CONTROL_CHARACTERS.search(name):
        raise ValueError(f"name must not contain control characters: {name!r}")
    return name
