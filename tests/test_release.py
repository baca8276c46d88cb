"""The release a user installs (issue 27, item 5): the wheel that ``./run build`` makes, not
this checkout, installed into a clean virtualenv, then the first steps of a new project there.

``pip install <wheel>[hiredis]`` runs from a temporary folder, so this source tree cannot be
imported instead of the installed package (the test checks where ``django_redlock`` comes
from). pip takes Django and redis-py from the index, as it does for a user.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import django_redlock
from tests.helpers import copy_of_the_source


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_built_wheel_installs_in_a_clean_venv_and_takes_a_lock(tmp_path, cluster3):
    dist, project, venv = tmp_path / "dist", tmp_path / "project", tmp_path / "venv"
    project.mkdir()
    subprocess.run(
        [sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(dist)],
        cwd=copy_of_the_source(tmp_path),
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = dist.glob("django_redlock-*.whl")
    assert wheel.name == f"django_redlock-{django_redlock.__version__}-py3-none-any.whl"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def run(*command: str) -> str:
        done = subprocess.run(
            command, cwd=project, env=env, capture_output=True, text=True, timeout=480
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    run("python", "-m", "pip", "install", "--quiet", f"{wheel}[hiredis]")
    where = run("python", "-c", "import django_redlock as d; print(d.__file__, d.__version__)")
    location, version = where.split()
    assert Path(location).is_relative_to(venv), f"imported from {location}, not the venv"
    assert version == django_redlock.__version__
    run("python", "-c", "import hiredis")  # the extra came along

    run("django-admin", "startproject", "mysite", ".")
    settings = project / "mysite" / "settings.py"
    nodes = ", ".join(f'"{url}"' for url in cluster3.urls)
    settings.write_text(
        settings.read_text()
        + '\nINSTALLED_APPS = [*INSTALLED_APPS, "django_redlock"]\n'
        + f'REDLOCK = {{"NODES": [{nodes}]}}\n'
    )
    migrated = run("python", "manage.py", "migrate")
    assert "django_redlock" in migrated  # the migrations are in the wheel
    assert "no issues" in run("python", "manage.py", "check")
    snippet = (
        "from django_redlock import lock_for\n"
        "with lock_for('release:first') as lease:\n"
        "    print('held', lease.name, lease.validity > 0)\n"
    )
    # The lock runs the Lua scripts, so they are in the wheel too.
    assert "held release:first True" in run("python", "manage.py", "shell", "-c", snippet)
    status = run("python", "manage.py", "redlock_status")
    assert "down" not in status, status
