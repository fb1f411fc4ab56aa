"""The compiled build: the per-frame modules compiled with mypyc, used only where they
match their sources (docs/architecture.md, Compiled modules).

``make install`` runs ``python -m router.native_build``, which compiles :data:`MODULES` in place:
each gets an extension module beside its source (``websocket.cpython-311-x86_64-linux-gnu.so``
next to ``websocket.py``), which the import system prefers, and one shared library holds
their code (``router/_native__mypyc``). The build then writes a stamp for the interpreter
it ran on: the SHA-256 of the package's sources.

When the package is imported, :func:`choose` compares that stamp with the sources. Where the
stamp is missing or stale (a source edited since the build), or ``ACP_ROUTER_PURE=1`` is set
(for a debugger, a profiler or coverage, which see only Python code), those modules are
imported from their sources (:class:`SourcesFirst`, first on ``sys.meta_path``; every other
module always is). So a compiled module runs only if it is on the list and was built from
the code beside it, and the same code runs either way.

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

#: the modules every routed frame runs through with no coroutine in them (the core's routing
#: and parse, the WebSocket framing), as measured by ``python -m bench.instructions``
#: (BENCHMARKS.md): compiled on every Python. Each must compile under mypyc's rules: no
#: msgspec.Struct or subclass of a builtin exception defined in it, no function assigned as
#: a method, no decorator from a library that sets attributes on the function.
SYNCHRONOUS = (
    "router.core.authentication",
    "router.core.backend_side",
    "router.core.client_side",
    "router.core.gate",
    "router.core.links",
    "router.core.routes",
    "router.protocol.acp",
    "router.protocol.ids",
    "router.protocol.reading",
    "router.protocol.utf8",
    "router.server.links.sansio_websocket",
    "router.server.links.websocket",
)
#: the per-frame modules that define coroutines (the client connection, a backend link):
#: compiled on Python 3.11 only. On 3.12 and later a compiled coroutine that passes an
#: exception on to what it awaits (a cancellation, say) throws it with the (type, exc, tb)
#: signature of throw() that 3.12 deprecates (mypyc/mypyc#1214): a DeprecationWarning at
#: every cancelled await, an error where warnings are, as in the test suite.
COROUTINES = (
    "router.server.connection.client",
    "router.server.connection.client_links",
    "router.server.connection.request_log",
    "router.server.connection.websocket_channel",
    "router.server.links.backend_link",
)
#: what the build compiles on this interpreter
MODULES = SYNCHRONOUS + COROUTINES if sys.version_info < (3, 12) else SYNCHRONOUS
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
    """The SHA-256 of the package's sources, paths included: every one of them, not only
    :data:`MODULES`' (compiled code was checked against the types of what it imports)."""
    sha = hashlib.sha256()
    for file in sorted(PACKAGE.rglob("*.py")):
        sha.update(file.relative_to(PACKAGE).as_posix().encode() + b"\0")
        sha.update(file.read_bytes() + b"\0")
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
    """Imports the router's modules from their sources, but for :data:`MODULES` when they
    run compiled: an extension module left beside any other source (a module compiled by an
    older build, and since taken off the list) never runs."""

    def __init__(self, compiled: bool) -> None:
        self.compiled = compiled

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if path is None or not fullname.startswith("router."):
            return None
        if self.compiled and fullname in MODULES:
            return None  # the import system's own finder prefers the extension module
        name = fullname.rpartition(".")[2] + ".py"
        for folder in path:
            file = Path(folder, name)
            if file.is_file():
                return importlib.util.spec_from_file_location(fullname, file)
        return None  # a package (its __init__.py is never compiled), or no such module


#: whether :data:`MODULES` run compiled in this process (set by :func:`choose`)
COMPILED = False


def choose() -> bool:
    """Run :data:`MODULES` compiled if :func:`built` and not ``ACP_ROUTER_PURE=1``, every
    other module from its source. Returns whether they run compiled."""
    global COMPILED
    COMPILED = os.environ.get(PURE_ENV) != "1" and built()
    for finder in sys.meta_path:
        if isinstance(finder, SourcesFirst):
            finder.compiled = COMPILED
            return COMPILED
    sys.meta_path.insert(0, SourcesFirst(COMPILED))
    return COMPILED


def describe() -> str:
    """How :data:`MODULES` run here, for the start line and ``/metrics``."""
    return "compiled" if COMPILED else "pure"
