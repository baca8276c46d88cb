"""The README's first steps say what happens (issue 40, item 5): a node started for
development as the README prints it votes on its first request, and one started plainly just
now refuses, saying which node and for how long, as the README says.

The README's server command is run with the bundled server binary in place of
``redis-server`` (the arguments are the same) and a free port in place of 6379.
"""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from django_redlock import LockManager, QuorumUnreachable
from django_redlock.localnodes import LocalNode

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def readme_server_words() -> list[str]:
    """The arguments of the README's ``redis-server`` line."""
    section = README.split("## Add it to your project", 1)[1].split("\n## ", 1)[0]
    (line,) = [line for line in section.splitlines() if line.startswith("redis-server ")]
    return shlex.split(line.split("#", 1)[0])[1:]


def readme_server_arguments() -> list[str]:
    """The arguments of the README's ``redis-server`` line, without the port and the folder
    (a test's node has its own of each)."""
    words = readme_server_words()
    for option in ("--port", "--dir"):
        at = words.index(option)
        words = words[:at] + words[at + 2 :]
    return words


def test_the_readme_names_the_durable_arguments():
    assert readme_server_arguments() == ["--appendonly", "yes", "--appendfsync", "always"]


def test_the_readme_keeps_the_nodes_files_out_of_the_folder_it_is_started_in():
    words = readme_server_words()
    assert words[words.index("--dir") + 1] == "/tmp"


def test_a_node_started_as_the_readme_prints_votes_on_its_first_request(tmp_path):
    node = LocalNode(tmp_path, name="dev", tcp=True, extra_args=readme_server_arguments())
    node.start(fresh=False)  # as a user starts it: nothing declared
    manager = LockManager([node.url], node_timeout=0.5)  # the defaults' MAX_TTL: 60 s
    try:
        manager.acquire("report:1", blocking=False).release()
    finally:
        manager.close()
        node.stop()


def test_a_node_started_plainly_refuses_and_says_which_and_for_how_long(tmp_path):
    node = LocalNode(tmp_path, name="plain", tcp=True)
    node.start(fresh=False)
    manager = LockManager([node.url], node_timeout=0.5)
    try:
        with pytest.raises(QuorumUnreachable) as raised:
            manager.acquire("report:1", blocking=False)
    finally:
        manager.close()
        node.stop()
    text = str(raised.value)
    assert manager.addresses[0].label in text
    assert raised.value.quarantined is not None
    assert 55 <= raised.value.quarantined <= 60
    assert "by itself" in text
    # The README says the same: it refuses until up MAX_TTL (60 s), then votes by itself.
    assert "until it has been up that long" in README
    assert "`MAX_TTL` (60 s by default)" in README
