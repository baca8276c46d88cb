"""Every Python block of the README and of docs/ runs as printed, on real nodes (issues 23
and 27).

Each ```python block is executed, whole and unchanged, in a namespace that holds what a
user's own project would (their ``account``, ``invoice``, a Celery ``app``...). That setup is
written in the page itself, in an HTML comment right above the block (``<!-- setup:`` ...
``-->``): GitHub and PyPI do not show it, and it stays beside the block it serves. Two things
the harness does besides, and only these:

- the example node addresses (``redis://10.0.0.1:6379/0`` ...) are mapped to the test's three
  real nodes, so an example that builds its own ``LockManager`` talks to real servers;
- a coroutine function the block defines that takes no arguments (``async def
  daily_report():``) is then run, so the asyncio examples run too, not only compile;
- a model the block declares (``class Seat(FencedModel)``) gets its table as ``migrate``
  would, and one saved row under its name in lower case (``seat``), the moment the class is
  created; both are removed afterwards;
- nodes a block starts (a ``LocalCluster``) are stopped afterwards.

The blocks of one page run in order in one namespace, as a reader pastes them one after the
other (a page that builds ``manager`` in one block uses it in the next).

A renamed argument, a missing import or a wrong spelling in the docs fails here.
"""

from __future__ import annotations

import inspect
import re
import textwrap
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from django.apps import apps
from django.db import connection
from django.db.models.signals import class_prepared

from django_redlock import default_manager
from django_redlock.localnodes import LocalCluster

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BLOCK = re.compile(
    r"(?:<!-- setup:\n(?P<setup>.*?)-->\n\n?)?^```python\n(?P<code>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
#: The module the blocks run as: in the tests' own app, so a model a block declares is one.
MODULE = "tests.testapp.readme"
EXAMPLE_NODES = re.compile(r"redis://10\.0\.0\.(\d):6379/0")

#: What every block may use, as a user's project would have it (the README's blocks name
#: these without defining them). Blocks with more needs say so in their own setup comment.
COMMON = textwrap.dedent(
    """
    import os
    from types import SimpleNamespace

    from django_redlock import get_manager
    from tests.testapp.models import Invoice


    def env(name):
        return os.environ.get(name, "")


    class Work:
        '''A stand-in for the user's own work: callable, and awaitable when awaited.'''

        def __init__(self, *args, **kwargs):
            pass

        def __await__(self):
            return iter(())


    manager = get_manager()  # the README's blocks build on "manager" once it is shown
    def compute_total(invoice):
        return 42


    customer = "ada"
    account = Invoice.objects.create(number="account-1")
    invoice = Invoice.objects.create(number="invoice-1")
    report = Invoice.objects.create(number="report-1")
    build_report = call_partner_api = load_prices = rebuild_prices = transfer = render = Work
    """
)


def blocks(page: Path) -> list[tuple[int, str, str]]:
    """(line, setup, code) of every Python block of ``page``, in order."""
    text = page.read_text(encoding="utf-8")
    found = []
    for match in BLOCK.finditer(text):
        line = text.count("\n", 0, match.start("code"))
        found.append((line, match["setup"] or "", match["code"]))
    return found


def pages_with_blocks() -> list[Path]:
    return [page for page in PAGES if blocks(page)]


def run(code: str, filename: str, namespace: dict[str, Any]) -> None:
    """Run ``code`` as ``filename`` (tracebacks name the README's lines)."""
    exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - running them is the point


@pytest.fixture
def restore_manager_factory():
    factory = default_manager._manager_factory
    yield
    default_manager.set_manager_factory(factory)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("page", pages_with_blocks(), ids=lambda p: str(p.relative_to(ROOT)))
@pytest.mark.usefixtures("redlock_nodes")
def test_every_python_block_runs_as_printed(
    page: Path, cluster3: Any, restore_manager_factory: None
) -> None:
    def node(match: re.Match[str]) -> str:
        return str(cluster3.urls[int(match[1]) - 1])

    namespace: dict[str, Any] = {"__name__": MODULE}
    declared: list[Any] = []
    name = str(page.relative_to(ROOT))

    def migrate(sender: Any, **kwargs: Any) -> None:
        if sender.__module__ != MODULE:
            return
        with connection.schema_editor() as editor:
            editor.create_model(sender)
        declared.append(sender)
        namespace[sender.__name__.lower()] = sender.objects.create()

    run(COMMON, "<common setup>", namespace)
    class_prepared.connect(migrate)
    try:
        for line, setup, code in blocks(page):
            run(setup, f"{name}:{line} setup", namespace)
            before = set(namespace)
            run(EXAMPLE_NODES.sub(node, code), f"{name}:{line + 1}", namespace)
            for value in [v for k, v in namespace.items() if k not in before]:
                if inspect.iscoroutinefunction(value) and all(
                    p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
                    for p in inspect.signature(value).parameters.values()
                ):
                    # As Django runs an async view from sync code: its ORM calls
                    # (sync_to_async) then run in this thread, on the test's connection.
                    async_to_sync(value)()
    finally:
        class_prepared.disconnect(migrate)
        for value in namespace.values():
            if isinstance(value, LocalCluster):
                value.stop()
        for model in declared:
            with connection.schema_editor() as editor:
                editor.delete_model(model)
            del apps.all_models[model._meta.app_label][model._meta.model_name]
        apps.clear_cache()


def test_every_python_fence_is_collected():
    for page in PAGES:
        fences = len(re.findall(r"^```python$", page.read_text(encoding="utf-8"), re.MULTILINE))
        assert len(blocks(page)) == fences, page
    assert sum(len(blocks(page)) for page in PAGES) >= 15
