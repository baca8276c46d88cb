"""The testing how-to's examples are tests a user copies into a project: each is run here as
that project would run it (issue 40: the page was one paragraph with no example). The pytest
example runs under pytest-django in a fresh process; the ``SimpleTestCase`` one under
Django's own unittest runner. Both start their own real nodes, as the page says."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "howto" / "testing.md").read_text(encoding="utf-8")
BLOCKS = re.findall(r"^```python\n(.*?)^```", PAGE, re.MULTILINE | re.DOTALL)


def run(arguments: list[str], folder: Path) -> subprocess.CompletedProcess[str]:
    environment = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "tests.settings",
        "PYTHONPATH": os.pathsep.join([str(ROOT), str(folder)]),
    }
    return subprocess.run(
        [sys.executable, *arguments],
        cwd=folder,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_pytest_example_passes_as_a_project_runs_it(tmp_path):
    (tmp_path / "test_example.py").write_text(BLOCKS[0])
    done = run(["-m", "pytest", "-q", "-p", "no:cacheprovider", "test_example.py"], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 passed" in done.stdout


def test_the_django_testcase_example_passes_under_djangos_runner(tmp_path):
    (tmp_path / "example_tests.py").write_text(BLOCKS[1])
    code = (
        "import django, unittest, sys; django.setup(); "
        "suite = unittest.defaultTestLoader.loadTestsFromName('example_tests'); "
        "result = unittest.TextTestRunner(verbosity=2).run(suite); "
        "sys.exit(not result.wasSuccessful() or result.testsRun != 1)"
    )
    done = run(["-c", code], tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
