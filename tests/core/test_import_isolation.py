"""The core (every module of ``django_redlock.core``, ``django_redlock.procedures`` and
``django_redlock.wire``, the managers, the errors and the node launcher) imports and works with
Django absent, ruff refuses a Django import in any of its modules, and its modules import each
other without a cycle; the procedures import no I/O at all (no socket, thread, asyncio,
selectors)."""

from __future__ import annotations

import ast
import json
import pkgutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import django_redlock.core
import django_redlock.procedures
import django_redlock.wire

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "django_redlock"
# The core outside its packages; everything in core/, procedures/ and wire/ is found by
# pkgutil, so a new module there is covered without touching this list.
TOP_LEVEL = [
    "django_redlock",
    "django_redlock.exceptions",
    "django_redlock.redlock",
    "django_redlock.aredlock",
    "django_redlock.localnodes",
]


def core_modules() -> list[str]:
    """Every module of the core, packages included, by dotted name."""
    found = list(TOP_LEVEL)
    for package in (django_redlock.core, django_redlock.procedures, django_redlock.wire):
        found.append(package.__name__)
        found.extend(
            module.name
            for module in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}.")
        )
    return found


def source_of(module: str) -> Path:
    relative = Path(*module.split("."))
    package = ROOT / relative / "__init__.py"
    return package if package.exists() else (ROOT / relative).with_suffix(".py")


def test_the_core_finds_every_module_of_its_packages():
    modules = core_modules()
    for expected in (
        "django_redlock.core.listing",
        "django_redlock.procedures.acquire",
        "django_redlock.wire.asyncio.connections",
    ):
        assert expected in modules
    on_disk = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for directory in ("core", "procedures", "wire")
        for path in (PACKAGE / directory).rglob("*.py")
    }
    assert on_disk <= set(modules)


# Runs with `import django` failing, as on a machine without Django installed.
ISOLATED = textwrap.dedent(
    """
    import asyncio
    import importlib
    import json
    import sys

    class NoDjango:
        def find_spec(self, name, path=None, target=None):
            if name == "django" or name.startswith("django."):
                raise ImportError("Django is not installed")
            return None

    sys.meta_path.insert(0, NoDjango())
    modules, urls = json.loads(sys.argv[1]), json.loads(sys.argv[2])
    for module in modules:
        importlib.import_module(module)

    from django_redlock import AsyncLockManager, LockContended, LockManager
    from django_redlock.core.health import status

    manager, rival = LockManager(urls), LockManager(urls)
    with manager.lock("no-django", ttl=5.0):
        try:
            rival.acquire("no-django", blocking=False)
        except LockContended:
            pass
        else:
            raise SystemExit("a second sync acquire should have been contended")
    report = status(manager)
    assert report.healthy, report.as_dict()

    async def main():
        amanager = AsyncLockManager(urls)
        try:
            lease = await amanager.acquire("no-django-async", ttl=5.0)
            try:
                rival.acquire("no-django-async", blocking=False)
            except LockContended:
                pass
            else:
                raise SystemExit("a sync acquire should have been contended by the async one")
            await lease.release()
        finally:
            await amanager.aclose()

    asyncio.run(main())
    rival.acquire("no-django-async", blocking=False).release()  # released above: free again
    manager.close()
    rival.close()
    leaked = sorted(m for m in sys.modules if m == "django" or m.startswith("django."))
    assert not leaked, leaked
    print("ok", len(modules))
    """
)


def test_every_core_module_imports_and_runs_without_django(cluster3):
    modules = core_modules()
    result = subprocess.run(
        [sys.executable, "-c", ISOLATED, json.dumps(modules), json.dumps(cluster3.urls)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok", str(len(modules))]


@pytest.mark.parametrize("module", core_modules())
def test_ruff_refuses_a_django_import_in_every_core_module(module):
    source = "from __future__ import annotations\n\nimport django.conf\n\nprint(django.conf)\n"
    path = source_of(module).relative_to(ROOT)
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--select", "TID251", "--stdin-filename", path],
        input=source,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "TID251" in result.stdout, (path, result.stdout, result.stderr)


def test_ruff_lets_the_django_side_import_django():
    """The ban is scoped: the check above would pass for a config that bans Django everywhere."""
    source = "from __future__ import annotations\n\nimport django.conf\n\nprint(django.conf)\n"
    result = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--stdin-filename", "django_redlock/conf.py"],
        input=source,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout


# Runs with the I/O modules refused, and the root package (whose __init__ imports the managers)
# stood in for by a bare package, so only what the named modules import is imported.
PURE = textwrap.dedent(
    """
    import importlib
    import json
    import sys
    import types

    REFUSED = {"socket", "_socket", "ssl", "threading", "asyncio", "selectors", "django"}

    class NoIO:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in REFUSED:
                raise ImportError(f"{name} is refused here")
            return None

    sys.meta_path.insert(0, NoIO())
    root = types.ModuleType("django_redlock")
    root.__path__ = ["django_redlock"]
    sys.modules["django_redlock"] = root
    for module in json.loads(sys.argv[1]):
        importlib.import_module(module)
    print("ok")
    """
)


def pure_run(modules: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", PURE, json.dumps(modules)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_procedures_import_no_socket_thread_asyncio_selectors_or_django():
    modules = [
        module for module in core_modules() if module.startswith("django_redlock.procedures")
    ]
    assert "django_redlock.procedures.effects" in modules
    result = pure_run(modules)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["ok"]


@pytest.mark.parametrize(
    "module", ["django_redlock.wire.sync.driver", "django_redlock.wire.asyncio.driver"]
)
def test_the_purity_check_refuses_a_driver(module):
    """The check above can fail: the drivers, which do the I/O, are refused by it."""
    result = pure_run([module])
    assert result.returncode != 0
    assert "is refused here" in result.stderr


def runtime_imports(source: str, module: str, package: str) -> set[str]:
    """The modules ``source`` (of ``module``, in ``package``) may import when it runs: at
    module level or inside functions (a cycle hidden in a function is still a cycle), but not
    under ``if TYPE_CHECKING:``, which never runs."""
    imported: set[str] = set()

    class Imports(ast.NodeVisitor):
        def visit_If(self, node: ast.If) -> None:
            test = node.test
            name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
            for child in node.orelse if name == "TYPE_CHECKING" else [*node.body, *node.orelse]:
                self.visit(child)

        def visit_Import(self, node: ast.Import) -> None:
            imported.update(alias.name for alias in node.names)

        def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
            base = node.module or ""
            if node.level:
                parent = package.rsplit(".", node.level - 1)[0]
                base = f"{parent}.{base}" if base else parent
            imported.add(base)
            # `from package import module` imports that module too.
            imported.update(f"{base}.{alias.name}" for alias in node.names)

    Imports().visit(ast.parse(source))
    return imported - {module}


def test_the_import_finder_sees_function_imports_and_skips_type_checking_ones():
    source = textwrap.dedent(
        """
        from typing import TYPE_CHECKING
        from . import sibling
        from ..wire.nodes import parse_node
        if TYPE_CHECKING:
            from pkg.typing_only import T
        def late():
            import pkg.late
        """
    )
    found = runtime_imports(source, "pkg.core.mod", "pkg.core")
    assert {"pkg.core.sibling", "pkg.wire.nodes", "pkg.late"} <= found
    assert "pkg.typing_only" not in found


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as a path that ends where it starts, or None."""
    state: dict[str, str] = {}
    path: list[str] = []

    def walk(node: str) -> list[str] | None:
        state[node] = "open"
        path.append(node)
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                return [*path[path.index(target) :], target]
            if target not in state and (cycle := walk(target)):
                return cycle
        state[node] = "done"
        path.pop()
        return None

    for node in sorted(graph):
        if node not in state and (cycle := walk(node)):
            return cycle
    return None


def test_the_cycle_finder_finds_a_cycle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_the_core_imports_its_modules_without_a_cycle():
    # The package root re-exports the core, and importing any submodule runs it first: that
    # is how packages work, not a cycle, so it is left out.
    modules = set(core_modules()) - {"django_redlock"}
    graph = {}
    for module in modules:
        path = source_of(module)
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        graph[module] = runtime_imports(path.read_text(), module, package) & modules
    assert find_cycle(graph) is None, " -> ".join(find_cycle(graph) or [])
