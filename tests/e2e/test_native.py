"""The compiled build (:mod:`router.native`) as real subprocesses: the per-frame modules run
compiled only where a build made from the sources beside them is there, and the router says
which it runs on.

The build itself is ``make install``'s (``python -m router.native_build``); where this
interpreter has none, the tests that need one skip, saying so.
"""

from __future__ import annotations

import ast
import importlib.machinery
import json
import re
import shutil
import sys
from pathlib import Path

import aiohttp
import pytest

from router import native
from tests.e2e.support import write_config
from tests.fleet import start_fleet
from tests.support import run_cli, run_to_exit

SUFFIX = importlib.machinery.EXTENSION_SUFFIXES[0]
NEEDS_BUILD = pytest.mark.skipif(
    not native.built(), reason="no compiled build for this interpreter (make install makes it)"
)
#: prints whether the modules run compiled, and the file each was imported from
REPORT = (
    "import importlib, json, router.native as n; "
    "print(json.dumps([n.COMPILED, [importlib.import_module(m).__file__ for m in n.MODULES]]))"
)
#: prints the file each per-frame module was imported from, the build's or not
EVERY_MODULE = (
    "import importlib, json, router.native as n; print(json.dumps("
    "{m: importlib.import_module(m).__file__ for m in n.SYNCHRONOUS + n.COROUTINES}))"
)


async def imported(root: Path, pure: bool = False) -> tuple[bool, list[str]]:
    """Whether the ``router`` package in ``root`` runs its modules compiled, and their files."""
    env = {"PYTHONPATH": str(root), **({native.PURE_ENV: "1"} if pure else {})}
    run = await run_to_exit(sys.executable, "-P", "-c", REPORT, env=env)  # -P: not from here
    assert run.returncode == 0, run.stderr
    compiled, files = json.loads(run.stdout)
    return compiled, files


def copy_of_package(tmp_path: Path) -> Path:
    """The router package, compiled modules and stamp included, in ``tmp_path``."""
    shutil.copytree(
        native.PACKAGE, tmp_path / "router", ignore=shutil.ignore_patterns("__pycache__")
    )
    return tmp_path


@NEEDS_BUILD
async def test_a_build_made_from_these_sources_runs_compiled(tmp_path: Path) -> None:
    compiled, files = await imported(copy_of_package(tmp_path))
    assert compiled
    assert all(f.endswith(SUFFIX) for f in files), files


@NEEDS_BUILD
async def test_only_what_this_python_compiles_runs_compiled(tmp_path: Path) -> None:
    """On 3.12 and later the modules with coroutines run from their sources."""
    root = copy_of_package(tmp_path)
    run = await run_to_exit(sys.executable, "-P", "-c", EVERY_MODULE, env={"PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr
    files: dict[str, str] = json.loads(run.stdout)
    compiled = {m for m, file in files.items() if file.endswith(SUFFIX)}
    assert compiled == set(native.MODULES), files
    if sys.version_info >= (3, 12):
        assert not compiled & set(native.COROUTINES), files


def test_what_every_python_compiles_has_no_coroutine() -> None:
    """A compiled coroutine on 3.12+ passes exceptions on with the deprecated throw()
    signature, so no module compiled there awaits, or delegates with ``yield from``; and a
    compiled class cannot subclass one of a module left to its sources, that defines
    ``__slots__``, so none imports from those modules."""
    shapes = (ast.AsyncFunctionDef, ast.Await, ast.AsyncFor, ast.AsyncWith, ast.YieldFrom)
    for module in native.SYNCHRONOUS:
        tree = ast.parse(native.source(module).read_text())
        found = [node.lineno for node in ast.walk(tree) if isinstance(node, shapes)]
        assert not found, (module, found)
        imports = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
        assert not imports & set(native.COROUTINES), module


@NEEDS_BUILD
async def test_pure_imports_every_compiled_module_from_its_source(tmp_path: Path) -> None:
    compiled, files = await imported(copy_of_package(tmp_path), pure=True)
    assert not compiled
    assert all(f.endswith(".py") for f in files), files


@NEEDS_BUILD
async def test_a_source_edited_after_the_build_runs_from_its_source(tmp_path: Path) -> None:
    """Not only the edited module: the build compiled them together (calls between them are
    direct), so a stale stamp means every one of them runs from its source."""
    root = copy_of_package(tmp_path)
    edited = root / "router" / "core" / "gate.py"
    edited.write_text(edited.read_text() + "\n# edited after the build\n")
    compiled, files = await imported(root)
    assert not compiled
    assert all(f.endswith(".py") for f in files), files


@NEEDS_BUILD
async def test_no_stamp_runs_the_sources(tmp_path: Path) -> None:
    root = copy_of_package(tmp_path)
    (root / "router" / native.stamp_path().name).unlink()
    compiled, files = await imported(root)
    assert not compiled
    assert all(f.endswith(".py") for f in files), files


@pytest.mark.parametrize("pure", [False, True])
async def test_the_router_says_how_its_modules_run(tmp_path: Path, pure: bool) -> None:
    """In its start log line and on ``/metrics`` (``acp_router_modules_info``)."""
    modules = "pure" if pure or not native.COMPILED else "compiled"  # as this process runs
    async with start_fleet(tmp_path / "store", 1) as agents:
        config = write_config(tmp_path / "router.toml", agents, 'listen = "127.0.0.1:0"')
        env = {native.PURE_ENV: "1"} if pure else None
        async with run_cli("serve", "--config", str(config), env=env) as serve:
            match = re.fullmatch(r"acp-router listening on ws://(\S+)/acp", serve.first_line)
            assert match is not None, serve.first_line
            await serve.wait_for_log(f", {modules} modules")
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://{match.group(1)}/metrics") as response,
            ):
                metrics = await response.text()
            assert f'acp_router_modules_info{{modules="{modules}"}} 1.0' in metrics.splitlines()


async def test_an_extension_module_off_the_list_never_runs(tmp_path: Path) -> None:
    """One an older build compiled, say: the module it stands beside runs from its source,
    compiled build or not."""
    root = copy_of_package(tmp_path)
    (root / "router" / "core" / f"ending{SUFFIX}").write_bytes(b"not a shared object")
    script = "import router.core.ending as m; print(m.__file__)"
    run = await run_to_exit(sys.executable, "-P", "-c", script, env={"PYTHONPATH": str(root)})
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == str(root / "router" / "core" / "ending.py")
