"""The README's demo command serves a page that takes and releases a lock on 3 local nodes."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from django_redlock.localnodes import _free_port

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_demo_serves_node_state_and_takes_a_lock(tmp_path):
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "REDLOCK_DEMO_DB": str(tmp_path / "demo.db")}
    demo = subprocess.Popen(
        [sys.executable, "-m", "demo_site.run_demo", "--addr", f"127.0.0.1:{port}"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    opener = urllib.request.build_opener(
        urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar())
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                page = opener.open(base + "/", timeout=5).read().decode()
                break
            except OSError:
                assert demo.poll() is None, demo.stdout.read().decode() if demo.stdout else ""
                assert time.monotonic() < deadline, "the demo did not start"
                time.sleep(0.2)
        assert page.count('class="ok">up<') == 3
        assert "quorum available" in page
        token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
        assert token is not None
        form = urllib.parse.urlencode({"csrfmiddlewaretoken": token.group(1)}).encode()
        result = opener.open(base + "/lock/", data=form, timeout=10).read().decode()
        assert "Took and released &#x27;demo:button&#x27;" in result
    finally:
        os.killpg(demo.pid, signal.SIGINT)
        demo.wait(30)
        if demo.stdout:
            demo.stdout.close()
