"""The README's commands and code blocks work as printed (issue 23, item 6): every spelling
the docs show is one users will type.

The Python blocks also run, on real nodes, in tests/django/test_readme_blocks.py; here they
are compiled without Django (a top-level ``async with`` is a SyntaxError). The install lines
must name this project's folder and extras that exist, and the names the README imports must
exist.
"""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text(encoding="utf-8")


def blocks(language: str) -> list[tuple[int, str]]:
    found = []
    for match in re.finditer(rf"^```{language}\n(.*?)^```", README, re.MULTILINE | re.DOTALL):
        found.append((README.count("\n", 0, match.start()) + 1, match[1]))
    return found


@pytest.mark.parametrize(("line", "code"), blocks("python"), ids=lambda v: str(v)[:12])
def test_every_python_block_compiles_as_printed(line, code):
    compile(code, f"README.md:{line}", "exec")


def extras() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return set(config["options.extras_require"])


def test_every_install_line_names_this_folder_and_extras_that_exist():
    specs = re.findall(r'pip install "([^"]+)"', README)
    assert specs, "the README shows how to install"
    known = extras()
    for spec in specs:
        if spec.startswith("celery["):  # the broker's own extra, from the index
            continue
        folder, _, rest = spec.partition("[")
        assert folder == ".", f"{spec!r}: run from the clone's top folder, as '.[extra]'"
        assert (ROOT / "setup.cfg").exists()
        for extra in rest.rstrip("]").split(","):
            assert extra in known, f"{spec!r}: no extra {extra!r} in setup.cfg"


def test_adding_it_to_a_project_says_migrate_and_names_the_async_factory():
    section = README.split("## Add it to your project", 1)[1].split("\n## ", 1)[0]
    assert "manage.py migrate" in section
    assert "get_async_manager()" in README
    import django_redlock

    assert callable(django_redlock.get_async_manager)
    assert "get_async_manager" in django_redlock.__all__
