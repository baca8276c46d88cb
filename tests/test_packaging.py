"""The wheel ships what the package needs at run time."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_wheel_ships_lua_scripts_templates_and_type_marker(tmp_path):
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(tmp_path)],
        cwd=ROOT,
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("django_redlock-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for script in ("acquire", "release", "extend"):
        assert f"django_redlock/scripts/{script}.lua" in names
    assert "django_redlock/py.typed" in names
    templates = {name for name in names if name.startswith("django_redlock/templates/")}
    expected = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "django_redlock" / "templates").rglob("*.html")
    }
    assert templates == expected
    assert not any(name.startswith(("tests/", "demo_site/", "benchmarks/")) for name in names)
