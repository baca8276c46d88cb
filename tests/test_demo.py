"""The README's demo command: the booking story on 3 local nodes, its summary, and its site."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from django_redlock.localnodes import _free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_the_demo_tells_the_story_then_serves_it(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "REDLOCK_DEMO_DB": str(tmp_path / "demo.db")}
    demo = subprocess.Popen(
        [
            *(sys.executable, "-m", "demo_site.run_demo", "--addr", f"127.0.0.1:{port}"),
            *("--seats", "10", "--buyers", "3", "--seed", "7", "--limit", "40"),
        ],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    assert demo.stdout is not None
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    base = f"http://127.0.0.1:{port}"
    output: list[str] = []
    try:
        for line in demo.stdout:
            output.append(line)
            if line.startswith("serving until Ctrl-C"):
                break
        text = "".join(output)
        assert "serving until Ctrl-C" in text, text
        assert "nemesis (seed 7)" in text
        rows = text.split("Summary")[1].splitlines()[2:13]
        summary = {row[:26].strip(): row[26:].split() for row in rows}
        # With fencing every seat is sold exactly once, whatever the nemesis did.
        assert summary["seats sold"][0] == "10", text
        assert summary["sales recorded"][0] == "10", text
        assert summary["seats sold twice"][0] == "0", text
        assert "payment slots run out" in text  # payments hold slots of a semaphore
        page = opener.open(base + "/", timeout=10).read().decode()
        assert "Concert, fencing on" in page
        assert "Concert, fencing off" in page
        assert "No seat sold twice" in page
        assert page.count('class="ok">up<') == 3
        # A visitor buys a seat of the open sale through the @locked_view endpoint.
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        action = re.search(r'action="(/seats/\d+/book/)"', page)
        assert token is not None
        assert action is not None
        form = {"csrfmiddlewaretoken": token.group(1), "customer": "you"}
        data = urllib.parse.urlencode(form).encode()
        result = opener.open(base + action.group(1), data=data, timeout=10).read().decode()
        assert "Sold Open sale Z1 to you" in result
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(30)
        demo.stdout.close()


@pytest.mark.slow
def test_a_taken_port_is_a_clear_error_not_a_silent_demo(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        env = {**os.environ, "REDLOCK_DEMO_DB": str(tmp_path / "demo.db")}
        demo = subprocess.run(
            [sys.executable, "-m", "demo_site.run_demo", "--addr", f"127.0.0.1:{port}"],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert demo.returncode == 2
    assert f"the site could not be served on 127.0.0.1:{port}" in demo.stderr
    assert "pick another address with --addr" in demo.stderr


@pytest.mark.slow
def test_no_serve_tells_the_story_and_names_no_site(tmp_path):
    """``./run demo --no-serve`` exits after the summary and prints no URL (it printed "The
    site: http://..." though nothing served it)."""
    env = {**os.environ, "REDLOCK_DEMO_DB": str(tmp_path / "demo.db")}
    demo = subprocess.run(
        [
            *(sys.executable, "-m", "demo_site.run_demo", "--no-serve"),
            *("--seats", "6", "--buyers", "2", "--seed", "3", "--limit", "20"),
        ],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "Summary" in demo.stdout
    assert "nothing is served" in demo.stdout
    assert "http://" not in demo.stdout
