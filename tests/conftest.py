"""The suite runs with a temporary folder of its own (``TMPDIR``, which the processes it
starts inherit), and fails if anything is left in it at the end: a test, or a process it
started, that leaves a file behind is a bug to fix at its cause."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest


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
