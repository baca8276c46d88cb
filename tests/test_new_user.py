"""The README's "Add it to your project" lines, run as printed by a new user (issue 23, item 6).

A new virtualenv, ``pip install ".[hiredis]"`` in the top folder of this clone, a project made
by ``django-admin startproject``, the two settings the README shows, ``python manage.py
migrate``, then the README's ``lock_for`` on real nodes and ``redlock_status``. Nothing of the
test suite's own environment is used but the nodes (pip fetches Django and redis-py from the
index, as it does for a user).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import copy_of_the_source

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def section_commands() -> list[str]:
    """The shell lines of the README's "Add it to your project" section, comments removed."""
    section = README.split("## Add it to your project", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    return [line.split("#", 1)[0].strip() for line in block.splitlines() if line.strip()]


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_new_user_installs_migrates_and_locks_as_the_readme_says(tmp_path, cluster3):
    install, migrate = section_commands()
    assert install == 'pip install ".[hiredis]"'
    assert migrate == "python manage.py migrate"
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    bin_dir = venv / "bin"
    env = {
        **{k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")},
        "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
        "PIP_DISABLE_PIP_VERSION_CHECK": "1",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)

    def sh(command: str, cwd: Path) -> str:
        # The README's lines, through a shell as a user types them (quotes and all).
        done = subprocess.run(  # noqa: S602
            command, shell=True, cwd=cwd, env=env, capture_output=True, text=True, timeout=480
        )
        assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"
        return done.stdout

    sh(install, copy_of_the_source(tmp_path))  # "in the top folder of a clone of this repository"
    sh("django-admin startproject mysite .", tmp_path)
    settings = tmp_path / "mysite" / "settings.py"
    nodes = ", ".join(f'"{url}"' for url in cluster3.urls)
    settings.write_text(
        settings.read_text()
        # The README's two lines: INSTALLED_APPS = [..., "django_redlock"], and REDLOCK.
        + '\nINSTALLED_APPS = [*INSTALLED_APPS, "django_redlock"]\n'
        + f'REDLOCK = {{"NODES": [{nodes}]}}\n'
    )
    sh(migrate, tmp_path)
    snippet = (
        "from django_redlock import lock_for\n"
        "with lock_for('report:1') as lease:\n"
        "    print('held', lease.name, lease.validity > 0)\n"
    )
    assert "held report:1 True" in sh(f'python manage.py shell -c "{snippet}"', tmp_path)
    status = sh("python manage.py redlock_status", tmp_path)
    for url in cluster3.urls:  # every node is listed, and none is down
        assert url.split("?", 1)[0] in status, status
    assert "down" not in status, status
