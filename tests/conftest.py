"""The suite runs with a temporary folder of its own (``TMPDIR``, which the processes it
starts inherit), and fails if anything is left in it at the end: a test, or a process it
started, that leaves a file behind is a bug to fix at its cause.

Every test lives in the folder of its kind, and carries that kind's marker (``-m core``):

* ``tests/core``: the sans-I/O layers (``router/core``, ``router/protocol``), no sockets
  and no processes, seconds in all (``make test-fast``);
* ``tests/server``: everything else in one process: the shell, the agent, the host and
  the commands, real sockets where they talk (the router and its peers on loopback), and
  the repository's own files (docs, config examples, deploy files);
* ``tests/e2e``: tests that start processes (the CLI, fleets of agents, deploy tools).

A ``test_*.py`` directly in ``tests/`` (or a test anywhere else) stops the run before
any test runs: its kind must be chosen. A test module imports no other test module: the
helpers of one kind are in its folder's ``support.py`` (another kind may import them),
the helpers the kinds share stay in ``tests/``."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

TESTS = Path(__file__).parent
#: the folders of tests/ that hold tests, each its own marker (pyproject.toml)
KINDS = ("core", "server", "e2e")
WHERE = (
    "tests/core (router/core and router/protocol), tests/server (one process)"
    " or tests/e2e (processes)"
)


def pytest_sessionstart() -> None:
    """Refuse a test file directly in tests/: its kind must be chosen."""
    flat = sorted(path.name for path in TESTS.glob("test_*.py"))
    if flat:
        raise pytest.UsageError(f"tests/{', tests/'.join(flat)}: a test file goes in {WHERE}")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark each test with the kind of the folder it lives in."""
    for item in items:
        if not item.path.is_relative_to(TESTS):
            continue
        kind = item.path.relative_to(TESTS).parts[0]
        if kind not in KINDS:
            raise pytest.UsageError(f"{item.nodeid}: a test goes in {WHERE}")
        item.add_marker(kind)


@pytest.fixture(scope="session", autouse=True)
def temporary_folder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    tmp_path_factory.getbasetemp()  # pytest's own folders (tmp_path) stay where they were
    folder = Path(tempfile.mkdtemp(prefix="acp-router-tests-"))
    saved = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(folder)
    tempfile.tempdir = None  # read TMPDIR again
    try:
        yield folder
    finally:
        if saved is None:
            del os.environ["TMPDIR"]
        else:
            os.environ["TMPDIR"] = saved
        tempfile.tempdir = None
        left = sorted(str(path.relative_to(folder)) for path in folder.rglob("*"))
        if left:
            pytest.fail(f"the tests left these in the temporary folder {folder}: {left}")
        folder.rmdir()
