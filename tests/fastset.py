"""The fast set (``pytest --fast``, ``./run test --fast``): every test that starts no process.

A pytest plugin (``tests/conftest.py`` loads it). At collection it marks
``processes`` every test that starts a process, found from the code, not from a list: the
test's own code, the code of every fixture it uses (directly or through other fixtures), and,
followed through calls, every function and class of this project they name (code in files
under pytest's rootdir, outside site-packages), looking for what starts a process (``subprocess``,
``multiprocessing``, ``Popen``, ``fork``, ``posix_spawn``, or a fixture chosen at run time
by ``getfixturevalue``). The session's lock nodes are found
this way: ``cluster3`` uses ``_cluster3``, which names ``LocalCluster``, whose methods name
``subprocess``. A test the scan cannot see into can say so itself with
``@pytest.mark.processes``.

``--fast`` deselects the ``processes`` and ``slow`` tests, and while the rest run it refuses
any process start (an audit hook), so a test the scan missed fails, saying so, instead of
quietly starting servers in the fast run.
"""

from __future__ import annotations

import inspect
import os
import sys
import types
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest

MARK = "processes"
# What starts a process, as a name in code: the modules, and the attribute names of the
# calls (``os.fork()`` names ``os`` and ``fork``). A fixture chosen at run time
# (``request.getfixturevalue(f"cluster{size}")``) may be one that starts processes.
_STARTERS = frozenset(
    {"subprocess", "multiprocessing", "Popen", "fork", "forkpty", "posix_spawn", "getfixturevalue"}
)
# The audit events of a process start (https://docs.python.org/3/library/audit_events.html).
_START_EVENTS = frozenset(
    {"subprocess.Popen", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.system"}
)


class _Scan:
    """Whether code starts a process, decided once per code object (so that code reached
    again, through a cycle of calls included, adds nothing). Only the project's code is
    followed: ``root`` is pytest's rootdir."""

    def __init__(self, root: Path) -> None:
        self._root = str(root.resolve()) + os.sep
        self._seen: dict[types.CodeType, bool] = {}

    def ours(self, obj: object) -> bool:
        """Whether a function or class is the project's (library code is not followed: what
        it starts, the project starts through a name the scan sees, or not at all)."""
        if isinstance(obj, type):
            path = getattr(sys.modules.get(obj.__module__), "__file__", None) or ""
        else:
            code = getattr(obj, "__code__", None)
            path = code.co_filename if isinstance(code, types.CodeType) else ""
        path = os.path.realpath(path) if path else ""
        return path.startswith(self._root) and "site-packages" not in path

    def function(self, func: object) -> bool:
        if callable(func):
            func = inspect.unwrap(func)
        code = getattr(func, "__code__", None)
        if not isinstance(code, types.CodeType):
            return False
        return self._code(code, getattr(func, "__globals__", {}))

    def _class(self, cls: type) -> bool:
        for value in vars(cls).values():
            if isinstance(value, staticmethod | classmethod):
                value = value.__func__
            if isinstance(value, property):
                value = value.fget
            if isinstance(value, types.FunctionType) and self.function(value):
                return True
        return False

    def _code(self, code: types.CodeType, namespace: dict[str, Any]) -> bool:
        if code in self._seen:
            return self._seen[code]
        self._seen[code] = False  # a recursion back here adds nothing
        found = any(self._name(name, namespace) for name in code.co_names) or any(
            self._code(const, namespace)  # nested functions, lambdas, comprehensions
            for const in code.co_consts
            if isinstance(const, types.CodeType)
        )
        self._seen[code] = found
        return found

    def _name(self, name: str, namespace: dict[str, Any]) -> bool:
        if name in _STARTERS:
            return True
        value = namespace.get(name)
        if isinstance(value, types.ModuleType):
            return value.__name__ in _STARTERS
        if isinstance(value, type) and self.ours(value):
            return self._class(value)
        if isinstance(value, types.FunctionType) and self.ours(value):
            return self.function(value)
        return False


def starts_processes(item: pytest.Item, scan: _Scan) -> bool:
    """Whether the test, or a fixture it uses, starts a process (see the module docstring)."""
    if item.get_closest_marker(MARK) is not None:
        return True
    # Every fixture in the test's closure, the ones it gets through other fixtures included
    # (pytest has no public name for them; a doctest item has none).
    info = getattr(item, "_fixtureinfo", None)
    fixtures: Iterable[Any] = info.name2fixturedefs.values() if info is not None else ()
    for defs in fixtures:
        if any(scan.ours(d.func) and scan.function(d.func) for d in defs):
            return True
    return scan.function(getattr(item, "function", None))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--fast",
        action="store_true",
        help="run only the tests that start no process and are not marked slow "
        "(tests/fastset.py); a process started anyway fails its test",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARK}: starts a process, itself or through a fixture (found by tests/fastset.py; "
        "left out of --fast)",
    )
    if config.getoption("fast"):
        sys.addaudithook(_refuse_processes)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scan = _Scan(config.rootpath)
    for item in items:
        if starts_processes(item, scan):
            item.add_marker(MARK)
    if not config.getoption("fast"):
        return
    fast: list[pytest.Item] = []
    left_out: list[pytest.Item] = []
    for item in items:
        slow = item.get_closest_marker(MARK) or item.get_closest_marker("slow")
        (left_out if slow else fast).append(item)
    config.hook.pytest_deselected(items=left_out)
    items[:] = fast


# The test running in a --fast run, if any: an audit hook cannot be removed, so it refuses
# only while a test of the fast set runs.
_running: list[str] = []


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> object:
    if not item.config.getoption("fast"):
        return (yield)
    _running.append(item.nodeid)
    try:
        return (yield)
    finally:
        _running.pop()


def _refuse_processes(event: str, args: tuple[object, ...]) -> None:
    if _running and event in _START_EVENTS:
        raise RuntimeError(
            f"{_running[-1]} started a process ({event}) in a --fast run: tests/fastset.py did "
            "not see it coming; mark the test @pytest.mark.processes"
        )
