"""The README and docs/ name only what exists, install what exists, and build as a site
(issues 23 and 27): every spelling the docs show is one users will type.

Their Python blocks run, on real nodes, in tests/django/test_doc_blocks.py; here they are
compiled without Django (a top-level ``async with`` is a SyntaxError), and the names they give
in prose are checked against the code: system check ids, ``REDLOCK`` keys, error classes, and
the options of the management commands.
"""

from __future__ import annotations

import builtins
import configparser
import re
import subprocess
import sys
from pathlib import Path

import pytest

import django_redlock
from django_redlock import exceptions
from django_redlock.conf import DEFAULTS

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
TEXT = {page: page.read_text(encoding="utf-8") for page in PAGES}
README = TEXT[ROOT / "README.md"]


def blocks(language: str) -> list[tuple[str, str]]:
    found = []
    for page, text in TEXT.items():
        for match in re.finditer(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{page.relative_to(ROOT)}:{line}", match[1]))
    return found


@pytest.mark.parametrize(("where", "code"), blocks("python"), ids=lambda v: str(v)[:40])
def test_every_python_block_compiles_as_printed(where, code):
    compile(code, where, "exec")


def extras() -> set[str]:
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    return set(config["options.extras_require"])


def test_every_install_line_names_this_folder_and_extras_that_exist():
    specs = [spec for text in TEXT.values() for spec in re.findall(r'pip install "([^"]+)"', text)]
    assert specs, "the docs show how to install"
    known = extras()
    for spec in specs:
        if spec.startswith("celery["):  # the broker's own extra, from the index
            continue
        folder, _, rest = spec.partition("[")
        assert folder == ".", f"{spec!r}: run from the clone's top folder, as '.[extra]'"
        for extra in rest.rstrip("]").split(","):
            assert extra in known, f"{spec!r}: no extra {extra!r} in setup.cfg"


def test_the_front_page_is_short_and_says_migrate_and_names_the_async_factory():
    assert len(README.splitlines()) <= 200
    section = README.split("## Add it to your project", 1)[1].split("\n## ", 1)[0]
    assert "manage.py migrate" in section
    assert any("get_async_manager()" in text for text in TEXT.values())
    assert callable(django_redlock.get_async_manager)
    assert "get_async_manager" in django_redlock.__all__


def test_every_link_between_pages_points_to_a_page():
    for page, text in TEXT.items():
        for target in re.findall(r"\]\(((?:docs/|\.\./|[\w-]+/|[\w-]+\.md)[^)#\s]*)", text):
            if target.startswith(("http", "mailto")):
                continue
            assert (page.parent / target).resolve().exists(), f"{page.name}: {target}"


def test_the_readme_links_into_this_repository_and_to_files_that_exist():
    """README.md is PyPI's page too (setup.cfg's long_description), where a relative link
    would be resolved against PyPI's site: its links are absolute, into the repository."""
    repo_url = re.search(r"^repo_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert repo_url
    targets = re.findall(r"\]\(([^)\s]+)\)", README)
    assert targets
    for target in targets:
        assert target.startswith("https://"), f"README.md: {target} is relative"
        if target.startswith(f"{repo_url[1]}/blob/main/"):
            path = target.removeprefix(f"{repo_url[1]}/blob/main/").split("#", 1)[0]
            assert (ROOT / path).exists(), f"README.md: {target}"


def test_every_check_id_setting_and_error_class_named_exists():
    checks = "".join(
        (ROOT / "django_redlock" / name).read_text()
        for name in ("checks.py", "conf.py", "models.py")
    )
    builtin = {name for name in dir(builtins) if name[0].isupper()}
    errors = (
        builtin
        | {name for name in dir(exceptions) if not name.startswith("_")}
        | {
            "AlreadyQueued",  # contrib.celery
            "ImproperlyConfigured",  # Django's
            "CommandError",
            "SystemCheckError",
            "IntegrityError",
        }
    )
    for page, text in TEXT.items():
        for check_id in re.findall(r"django_redlock\.([EW]\d{3})\b", text):
            assert f"django_redlock.{check_id}" in checks, f"{page.name}: no check {check_id}"
        for short in re.findall(r"\bchecks? ((?:[EW]\d{3}(?:, )?)+)", text):
            for check_id in short.split(", "):
                assert f"django_redlock.{check_id}" in checks, f"{page.name}: no {check_id}"
        for key in re.findall(r"REDLOCK\[['\"]([A-Z_]+)['\"]\]", text):
            assert key in DEFAULTS, f"{page.name}: no setting REDLOCK[{key!r}]"
        suffixes = "Error|Lost|Contended|Unreachable|Released|Inherited|Extended|Token"
        for name in re.findall(rf"`([A-Z]\w*(?:{suffixes}|Unavailable|Write|Queued))`", text):
            assert name in errors, f"{page.name}: no error class {name}"


@pytest.mark.parametrize("command", ["redlock_status", "redlock_declare_fresh"])
def test_every_option_the_docs_give_a_command_exists(command):
    help_text = subprocess.run(
        [sys.executable, "manage.py", command, "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    for text in TEXT.values():
        for options in re.findall(rf"manage\.py {command} ((?:\[?--[\w-]+[^`\n]*)+)", text):
            for option in re.findall(r"--[\w-]+", options):
                assert option in help_text, f"{command} has no {option}"


@pytest.mark.slow
def test_the_site_builds_with_every_link_and_reference_resolved(tmp_path):
    """``./run docs``: MkDocs in strict mode fails on a broken link, a missing page in the
    navigation and an API reference (mkdocstrings) to a name that does not exist."""
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout + built.stderr
    api = (tmp_path / "reference" / "api" / "index.html").read_text()
    for name in ("LockManager", "AsyncLockManager", "FencedModel", "locked_task", "LockLost"):
        assert name in api
