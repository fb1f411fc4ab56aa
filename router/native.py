"""The compiled build: the per-frame modules compiled with mypyc, used only where they
match their sources (docs/architecture.md, Compiled modules).

``make install`` runs ``python -m router.native_build``, which compiles :data:`MODULES` in place:
each gets an extension module beside its source (``websocket.cpython-311-x86_64-linux-gnu.so``
next to ``websocket.py``), which the import system prefers, and one shared library holds
their code (``router/_native__mypyc``). The build then writes a stamp for the interpreter
it ran on: the SHA-256 of the sources it compiled.

When the package is imported, :func:`choose` compares that stamp with the sources. Where the
stamp is missing or stale (a source edited since the build), or ``ACP_ROUTER_PURE=1`` is set
(for a debugger, a profiler or coverage, which see only Python code), it puts a finder first
on ``sys.meta_path`` that imports those modules from their sources. So a compiled module runs
only if it was built from the code beside it, and the same code runs either way.

This module imports nothing of the router's: ``router/__init__.py`` imports it first.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from collections.abc import Sequence
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType

#: what the build compiles: the modules every routed frame runs through, as measured by
#: ``python -m bench.instructions`` (BENCHMARKS.md). Each must compile under mypyc's rules:
#: no msgspec.Struct or subclass of a builtin exception defined in it, no function assigned
#: as a method, no decorator from a library that sets attributes on the function.
MODULES = (
    "router.core.authentication",
    "router.core.backend_side",
    "router.core.client_side",
    "router.core.gate",
    "router.core.links",
    "router.core.routes",
    "router.protocol.acp",
    "router.protocol.ids",
    "router.server.connection.client",
    "router.server.connection.client_links",
    "router.server.connection.request_log",
    "router.server.connection.websocket_channel",
    "router.server.links.backend_link",
    "router.server.links.sansio_websocket",
    "router.server.links.websocket",
)
#: mypyc's shared library for :data:`MODULES`, inside the package
LIBRARY = "router._native"
#: set to ``1``: import :data:`MODULES` from their sources even where they are compiled
PURE_ENV = "ACP_ROUTER_PURE"

PACKAGE = Path(__file__).resolve().parent


def source(module: str) -> Path:
    """The source file of one of :data:`MODULES`."""
    return PACKAGE.parent.joinpath(*module.split(".")).with_suffix(".py")


def stamp_path() -> Path:
    """Where the build writes its stamp for this interpreter (``native-cpython-311.stamp``)."""
    return PACKAGE / f"native-{sys.implementation.cache_tag}.stamp"


def digest() -> str:
    """The SHA-256 of :data:`MODULES`' sources, names included."""
    sha = hashlib.sha256()
    for module in MODULES:
        sha.update(module.encode() + b"\0" + source(module).read_bytes() + b"\0")
    return sha.hexdigest()


def built() -> bool:
    """Whether this interpreter has a compiled build of :data:`MODULES` made from the sources
    beside it: its stamp matches them, and every extension module is there."""
    try:
        stamped = stamp_path().read_text().strip()
    except OSError:
        return False
    suffix = importlib.machinery.EXTENSION_SUFFIXES[0]
    modules = (*MODULES, LIBRARY + "__mypyc")
    present = all(source(m).with_suffix(suffix).is_file() for m in modules)
    return present and stamped == digest()


class SourcesFirst(importlib.abc.MetaPathFinder):
    """Imports :data:`MODULES` from their sources, whatever extension modules lie beside them."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in MODULES:
            return None
        return importlib.util.spec_from_file_location(fullname, source(fullname))


#: whether :data:`MODULES` run compiled in this process (set by :func:`choose`)
COMPILED = False


def choose() -> bool:
    """Run :data:`MODULES` compiled if :func:`built` and not ``ACP_ROUTER_PURE=1``; else
    import them from their sources. Returns whether they run compiled."""
    global COMPILED
    COMPILED = os.environ.get(PURE_ENV) != "1" and built()
    if not COMPILED and not any(isinstance(f, SourcesFirst) for f in sys.meta_path):
        sys.meta_path.insert(0, SourcesFirst())
    return COMPILED


def describe() -> str:
    """How :data:`MODULES` run here, for the start line and ``/metrics``."""
    return "compiled" if COMPILED else "pure"
