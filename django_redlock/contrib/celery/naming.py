"""The lock name of a locked task's call, formatted from its arguments: :class:`Namer`."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["Key", "Namer"]

Key = str | Callable[..., str]


class Namer:
    """Builds the lock name from a call's arguments, bound to the function's signature.

    Raises (at construction, that is at decoration time):
        ValueError: a field of a format-string key that no argument can ever fill.
    """

    def __init__(self, key: Key, function: Callable[..., Any], *, bound: bool | None) -> None:
        self.key = key
        self.function = function
        signature = inspect.signature(function)
        parameters = list(signature.parameters.values())
        self.unbound = signature
        self.bound = signature.replace(parameters=parameters[1:]) if parameters else signature
        if bound is None:
            # Under @app.task(bind=True) the decorator cannot see the binding: Celery's
            # convention names the task parameter "self", and it is never part of the key.
            bound = bool(parameters) and parameters[0].name == "self"
        if isinstance(key, str):
            self._check_fields(key, parameters[1:] if bound else parameters)

    def _check_fields(self, key: str, parameters: list[inspect.Parameter]) -> None:
        """Refuse, at decoration time, a field that no argument can ever fill."""
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters):
            return  # any name may arrive in **kwargs: checked at call time
        names = [p.name for p in parameters if p.kind is not inspect.Parameter.VAR_POSITIONAL]
        positional = sum(p.kind is not inspect.Parameter.KEYWORD_ONLY for p in parameters)
        try:
            fields = [field for _, field, _, _ in string.Formatter().parse(key) if field]
        except ValueError as error:
            raise ValueError(f"key {key!r} is not a valid format string: {error}") from None
        for field in fields:
            head = field.split(".", 1)[0].split("[", 1)[0]
            if head.isdigit():
                if int(head) >= positional and not any(
                    p.kind is inspect.Parameter.VAR_POSITIONAL for p in parameters
                ):
                    raise ValueError(
                        f"key {key!r} refers to positional argument {{{head}}}, but "
                        f"{self._describe()} takes {positional} positional argument(s)"
                    )
            elif head == "":
                raise ValueError(
                    f"key {key!r} has an empty field {{}}: name the argument, e.g. "
                    f"{{{names[0] if names else 'name'}}}"
                )
            elif head not in names:
                raise ValueError(
                    f"key {key!r} refers to {{{head}}}, which is not an argument of "
                    f"{self._describe()} ({', '.join(names) or 'it takes none'})"
                )

    def _describe(self) -> str:
        return f"{self.function.__module__}.{self.function.__qualname__}"

    def name(self, args: tuple[Any, ...], kwargs: Mapping[str, Any], *, bound: bool) -> str:
        """The lock name for a call with ``args``/``kwargs`` (without the bound task).

        Raises:
            ValueError: a field of the key is missing from this call's arguments.
            TypeError: the arguments do not fit the function, or a key callable returned
                something other than a str.
        """
        if callable(self.key):
            resolved = self.key(*args, **kwargs)
            if not isinstance(resolved, str):
                raise TypeError(f"key callable must return a str, not {type(resolved).__name__}")
            return resolved
        signature = self.bound if bound else self.unbound
        try:
            call = signature.bind(*args, **kwargs)
        except TypeError as error:
            raise TypeError(f"{self._describe()}: {error}") from None
        call.apply_defaults()
        named: dict[str, Any] = {}
        for parameter in signature.parameters.values():
            value = call.arguments.get(parameter.name)
            if parameter.kind is inspect.Parameter.VAR_KEYWORD:
                named.update(value or {})
            elif parameter.kind is not inspect.Parameter.VAR_POSITIONAL:
                named[parameter.name] = value
        try:
            return self.key.format(*call.args, **named)
        except (KeyError, IndexError, AttributeError) as error:
            raise ValueError(
                f"key {self.key!r} refers to {error}, which this call of {self._describe()} "
                f"does not give (arguments: {', '.join(named) or 'none'})"
            ) from None
