"""The README's demo command: the booking story on 3 local nodes, its summary, and its site;
and whatever stops it, no process of its own is left behind (issue 40, item 7: stopped by
SIGINT from a script that ignored SIGINT, it hung and left a runserver and three servers)."""

from __future__ import annotations

import http.cookiejar
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from django_redlock.localnodes import _free_port, server_binary

ROOT = Path(__file__).resolve().parents[1]
SERVER = Path(server_binary()).name  # how the nodes' command lines start
# A process that starts the demo and waits for it: killed, it is the demo's parent dying.
PARENT = "import subprocess, sys; subprocess.run(sys.argv[1:])"


def group(pgid: int) -> dict[int, str]:
    """The live processes of process group ``pgid`` (a zombie has ended: left out), each
    pid with its command line, from /proc (Linux)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # it ended meanwhile
            continue
        state, _, pgrp = stat[stat.rindex(")") + 2 :].split()[:3]
        if int(pgrp) == pgid and state != "Z":
            found[int(entry.name)] = command.strip()
    return found


def left_after(pgid: int, timeout: float) -> dict[int, str]:
    """The processes of group ``pgid`` still there once it emptied or ``timeout`` s passed."""
    deadline = time.monotonic() + timeout
    while (left := group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_group(pgid: int) -> None:
    """The safety net of a failed test: SIGKILL whatever of the demo's group is left."""
    if group(pgid):
        os.killpg(pgid, signal.SIGKILL)


def ignore_sigint() -> None:  # runs in the child: as started from a script or in background
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def default_sigint() -> None:  # runs in the child: whatever this test process does with it
    signal.signal(signal.SIGINT, signal.SIG_DFL)


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
        start_new_session=True,  # its own process group: what is left of it can be found
        preexec_fn=ignore_sigint,  # Ctrl-C cannot stop it: SIGTERM must
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

        # SIGTERM to the demo alone: it stops its server and nodes itself, and waits for them.
        children = group(demo.pid)
        servers = [pid for pid, command in children.items() if SERVER in command]
        (site,) = [pid for pid, command in children.items() if "runserver" in command]
        assert len(servers) == 3, children
        os.kill(demo.pid, signal.SIGTERM)
        assert demo.wait(60) == 128 + signal.SIGTERM
        now = group(demo.pid)
        assert not [pid for pid in [site, *servers] if pid in now], now
        # What is left (multiprocessing's resource tracker) ends as the demo has.
        assert not left_after(demo.pid, 60)
    finally:
        kill_group(demo.pid)
        demo.wait(30)
        demo.stdout.close()


@pytest.mark.slow
@pytest.mark.parametrize("stop", ["SIGINT", "SIGKILL", "its parent killed"])
def test_the_demo_stopped_early_leaves_no_process(tmp_path, stop):
    """Ctrl-C or SIGKILL (no clean-up of its own runs) while buyers race and the nemesis
    pauses them and the nodes; or the death of the process that started it, once the nodes
    are up: nothing is left. (The last one before the story: there no process is stopped,
    so only the parent-death signal can end the demo; mid-story, the kernel's SIGHUP to a
    newly orphaned group with a stopped member would too.)"""
    port = _free_port()
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "REDLOCK_DEMO_DB": str(tmp_path / "demo.db")}
    command = [
        *(sys.executable, "-m", "demo_site.run_demo", "--addr", f"127.0.0.1:{port}"),
        # Left alone, it would serve for ever: only what the test does can end it.
        *("--seats", "60", "--buyers", "3", "--seed", "7", "--limit", "60"),
    ]
    if stop == "its parent killed":
        command = [sys.executable, "-c", PARENT, *command]
    output = tmp_path / "output.txt"  # a file, not a pipe that fills up while nobody reads
    with output.open("w") as out:
        leader = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=default_sigint,
        )
    # Mid-story: once a buyer runs; the parent: once the nodes are up.
    wanted = "spawn_main" if stop != "its parent killed" else SERVER
    try:
        deadline = time.monotonic() + 120
        found: list[int] = []
        while not found and leader.poll() is None and time.monotonic() < deadline:
            found = [pid for pid, line in group(leader.pid).items() if wanted in line]
            time.sleep(0.05)
        text = output.read_text()
        assert found, text
        if stop == "its parent killed":
            assert "Run 1" not in text, text  # before the story, as it should be
        else:
            assert "Run 1: fencing on" in text, text
        if stop == "SIGINT":
            os.kill(leader.pid, signal.SIGINT)
            assert leader.wait(60) == 130, output.read_text()
        else:  # the demo, or its parent: no clean-up of the killed process runs
            os.kill(leader.pid, signal.SIGKILL)
            leader.wait(60)
        left = left_after(leader.pid, 90)
        assert not left, f"{left}\n{output.read_text()}"
    finally:
        kill_group(leader.pid)
        leader.wait(30)


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
