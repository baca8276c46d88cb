"""The sdist and the wheel ship what the package needs at run time (the wheel is built from
the sdist, as pip builds one), no test files, and say what PyPI will show."""

from __future__ import annotations

import configparser
import re
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from pathlib import Path

import pytest

import django_redlock
from tests.helpers import copy_of_the_source

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist (so the
    wheel's tests also show that the sdist holds all it needs)."""
    outdir = tmp_path_factory.mktemp("dist")
    subprocess.run(
        [sys.executable, "-m", "build", "--no-isolation", "--outdir", str(outdir)],
        cwd=copy_of_the_source(tmp_path_factory.mktemp("clone")),
        check=True,
        capture_output=True,
        timeout=300,
    )
    return outdir


@pytest.fixture(scope="module")
def wheel(dist: Path) -> Path:
    (built,) = dist.glob("django_redlock-*.whl")
    return built


@pytest.fixture(scope="module")
def sdist(dist: Path) -> Path:
    (built,) = dist.glob("django_redlock-*.tar.gz")
    return built


@pytest.mark.slow
def test_the_sdist_carries_the_package_and_no_test_files(sdist, wheel):
    """setuptools adds tests/test*.py to an sdist by default: 9 files that cannot run without
    the rest of tests/ (issue 40, item 8). MANIFEST.in prunes tests/."""
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as archive:
        names = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    assert not [name for name in names if name == "tests" or name.startswith("tests/")]
    assert not [name for name in names if name.startswith(("demo_site/", "benchmarks/"))]
    assert {"README.md", "LICENSE", "CHANGELOG.md", "setup.cfg", "pyproject.toml"} <= names
    in_wheel = {
        name
        for name in zipfile.ZipFile(wheel).namelist()
        if name.startswith("django_redlock/") and not name.endswith("/")
    }
    assert any(name.endswith(".lua") for name in in_wheel)
    assert in_wheel <= names, f"in the wheel, not in the sdist: {sorted(in_wheel - names)}"


@pytest.mark.slow
def test_the_wheel_ships_lua_scripts_templates_migrations_and_type_marker(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    scripts = {
        str(path.relative_to(ROOT)) for path in (ROOT / "django_redlock" / "scripts").glob("*.lua")
    }
    assert {"acquire", "release", "extend"} <= {Path(name).stem for name in scripts}
    assert {name for name in names if name.startswith("django_redlock/scripts/")} == scripts
    assert "django_redlock/py.typed" in names
    templates = {name for name in names if name.startswith("django_redlock/templates/")}
    expected = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "django_redlock" / "templates").rglob("*.html")
    }
    assert templates == expected
    migrations = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "django_redlock" / "migrations").glob("*.py")
    }
    assert "django_redlock/migrations/0001_initial.py" in migrations
    assert migrations <= names
    assert not any(name.startswith(("tests/", "demo_site/", "benchmarks/")) for name in names)


@pytest.mark.slow
def test_the_metadata_has_the_one_version_and_a_readme_that_works_on_pypi(wheel):
    version = django_redlock.__version__
    assert wheel.name == f"django_redlock-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        raw = archive.read(f"django_redlock-{version}.dist-info/METADATA").decode()
    metadata = Parser().parsestr(raw)
    assert metadata["Version"] == version
    assert metadata["License-Expression"] == "MIT"
    assert "Framework :: Django :: 6.0" in (metadata.get_all("Classifier") or [])
    urls = dict(url.split(", ", 1) for url in metadata.get_all("Project-URL") or [])
    assert set(urls) == {"Documentation", "Source", "Changelog"}
    # The long description is the README, whose links must not be relative: PyPI would
    # resolve them against its own site.
    description = str(metadata.get_payload())
    assert description.strip() == (ROOT / "README.md").read_text(encoding="utf-8").strip()
    for target in re.findall(r"\]\(([^)\s]+)\)", description):
        assert target.startswith(("https://", "#")), f"a relative link on PyPI: {target}"


def test_the_version_is_written_in_one_place_and_the_changelog_has_it():
    config = configparser.ConfigParser()
    config.read(ROOT / "setup.cfg")
    assert config["metadata"]["version"] == "attr: django_redlock.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+", django_redlock.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    assert "## [Unreleased]" in changelog
    assert re.search(
        rf"^## \[{re.escape(django_redlock.__version__)}\] - \d{{4}}-\d\d-\d\d$",
        changelog,
        re.MULTILINE,
    )
    assert f"[{django_redlock.__version__}]: https://" in changelog
    repo_url = re.search(r"^repo_url: (\S+)$", (ROOT / "mkdocs.yml").read_text(), re.MULTILINE)
    assert repo_url
    assert config["metadata"]["url"] == repo_url[1]
