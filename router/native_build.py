"""Builds the compiled modules: ``python -m router.native_build`` (``make install`` runs it).

It compiles :data:`router.native.MODULES` in place with mypyc, which needs mypy (a dev
dependency) and a C compiler, then writes the stamp :func:`router.native.built` checks. It does
nothing when the stamp matches the sources. Where it fails, the router runs its sources.
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
from pathlib import Path

from mypyc.build import mypycify
from setuptools import Distribution

from router.native import (
    LIBRARY,
    MODULES,
    PACKAGE,
    built,
    digest,
    source,
    stamp_path,
)

_NAME = "router.native_build"
_TAG = sys.implementation.cache_tag


def build() -> int:
    """Compile :data:`~router.native.MODULES` in place, then write the stamp."""
    for stray in _strays():
        stray.unlink()
    if built():
        sys.stdout.write(f"{_NAME}: the compiled modules are up to date ({_TAG})\n")
        return 0
    stamp_path().unlink(missing_ok=True)
    root = PACKAGE.parent
    os.chdir(root)  # mypyc names modules by their path from here, and reads pyproject.toml
    paths = [str(source(m).relative_to(root)) for m in MODULES]
    target = Path("build") / f"native-{_TAG}"
    extensions = mypycify(paths, opt_level="3", group_name=LIBRARY, target_dir=str(target))
    distribution = Distribution({"name": "acp-router-native", "ext_modules": extensions})
    command = distribution.get_command_obj("build_ext")
    command.inplace = True
    command.build_temp = str(target / "temp")
    distribution.run_command("build_ext")
    stamp_path().write_text(digest() + "\n")
    sys.stdout.write(f"{_NAME}: compiled {len(MODULES)} modules ({_TAG})\n")
    return 0


def _strays() -> list[Path]:
    """This interpreter's extension modules in the package that the list no longer names."""
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    listed = (*MODULES, LIBRARY + "__mypyc")
    kept = {source(m).with_suffix(suffix) for m in listed}
    return [file for file in PACKAGE.rglob(f"*{suffix}") if file not in kept]


if __name__ == "__main__":
    raise SystemExit(build())
