"""``--fast`` (tests/fastset.py): the tests that start a process, themselves or through a
fixture, are left out, found from their code; the rest are not; and a process started anyway
in a fast run fails its test instead of running."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests import fastset

ROOT = Path(__file__).resolve().parents[1]

CONFTEST = """
import subprocess

import pytest


@pytest.fixture(scope="session")
def server():
    process = subprocess.Popen(["sleep", "60"])
    yield process
    process.kill()


@pytest.fixture
def fresh_server(server):
    return server
"""

TESTS = """
import os

import pytest


class Node:
    def start(self):
        return os.fork()


def start_a_node():
    return Node().start()


def test_plain():
    assert 1 + 1 == 2


def test_server(server):
    pass


def test_through_another_fixture(fresh_server):
    pass


def test_through_a_helper_and_a_class():
    start_a_node()


def test_chosen_at_run_time(request):
    request.getfixturevalue("ser" + "ver")


@pytest.mark.processes
def test_says_so_itself():
    pass


@pytest.mark.slow
def test_slow():
    pass
"""


def selected(result: pytest.RunResult) -> list[str]:
    return sorted(line.split("::", 1)[1] for line in result.outlines if "::" in line)


def run(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makeini("[pytest]\nmarkers =\n    slow: slow\n")
    # In this process: the plugin under test, and nothing of this project's own setup.
    return pytester.runpytest_inprocess(
        "-p", "no:django", "-p", "no:randomly", "-p", "no:cacheprovider", *args, plugins=[fastset]
    )


def test_fast_keeps_only_the_tests_that_start_no_process_and_are_not_slow(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_nodes=TESTS)
    result = run(pytester, "--fast", "--collect-only", "-q")
    assert selected(result) == ["test_plain"]
    result.stdout.fnmatch_lines(["1/7 tests collected (6 deselected)*"])


def test_without_fast_every_test_runs_and_the_others_are_marked(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_nodes=TESTS)
    result = run(pytester, "--collect-only", "-q", "-m", "processes")
    assert selected(result) == [
        "test_chosen_at_run_time",
        "test_says_so_itself",
        "test_server",
        "test_through_a_helper_and_a_class",
        "test_through_another_fixture",
    ]


def test_a_process_the_scan_cannot_see_fails_its_test_in_a_fast_run(pytester):
    pytester.makepyfile(
        test_hidden="""
        import importlib


        def test_hidden():
            module = importlib.import_module("sub" + "process")
            getattr(module, "run")(["true"])
        """
    )
    result = run(pytester, "--fast")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*test_hidden started a process (subprocess.Popen)*"])


def test_the_suites_fast_set_is_not_empty_and_holds_no_test_of_the_nodes():
    def collect(*args: str) -> set[str]:
        out = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly", *args],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return {line for line in out.splitlines() if "::" in line}

    fast = collect("--fast")
    of_the_nodes = collect("tests/core/test_redlock.py")  # every one asks for cluster3/5
    assert len(fast) >= 300  # the flow, the arguments, the checks, the simulator: most of it
    assert of_the_nodes
    assert not fast & of_the_nodes
    assert any(test.startswith("tests/core/test_flow.py::") for test in fast)
    assert any(test.startswith("tests/django/test_checks.py::") for test in fast)
    started_in_the_test = (
        "tests/test_readme_first_steps.py::"
        "test_a_node_started_as_the_readme_prints_votes_on_its_first_request"
    )
    assert started_in_the_test in collect("-m", "processes", "tests/test_readme_first_steps.py")
    assert started_in_the_test not in fast
