"""Pool-wide answers the router composes itself, sans-I/O: the merged
``session/list`` with its opaque cursor, and the capabilities it advertises.

The list cursor carries, for every backend that still has pages, that backend's
own cursor, so each backend pages through its own list and the router keeps no
state between calls (any replica can serve the next page).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from router import __version__
from router.protocol import acp
from router.protocol.errors import BackendLinkLost, InvalidParams, LocateInconclusive
from router.protocol.ids import BackendId
from router.protocol.jsontext import dumps, loads

_CURSOR_VERSION = 1
#: bounds on what ``session/list`` sends every backend's control link: a longer ``cwd`` is no
#: path (Linux PATH_MAX is 4096 bytes), and a router cursor this long is not one it made
MAX_CWD_CHARS = 4096
MAX_CURSOR_CHARS = 65_536

#: Whether the probe sent beside each backend's page (to see a frozen one within the
#: probe timeout) reports an unanswered probe to the pool's health
#: (:mod:`router.core.health`): it does not. A backend busy with a slow list may answer
#: nothing else meanwhile (one that reads a large store, or answers its link's frames in
#: turn), and one client's pages are no evidence for everyone: such a backend is left out
#: of that page (``_meta.unlistedBackends``) and nothing more. The probes of a locate or
#: a ``session/status``, and the silent watch, move a backend's health.
PAGE_PROBES_REPORT = False


@dataclass(frozen=True, slots=True)
class ListPage:
    """One ``session/list`` call over the pool."""

    cwd: str | None
    #: backend id -> that backend's cursor (None: its first page)
    pending: Mapping[BackendId, str | None]

    @classmethod
    def from_params(cls, params: Any, ready: Sequence[BackendId]) -> ListPage:
        """The page a client's ``session/list`` params ask for, over the ``ready`` backends.

        Raises :class:`InvalidParams` for a ``cwd`` or ``cursor`` that is not a string,
        or a cursor this router did not make.
        """
        params = params if isinstance(params, dict) else {}
        cwd = params.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise InvalidParams("session/list: cwd must be a string")
        if cwd is not None and len(cwd) > MAX_CWD_CHARS:
            raise InvalidParams(f"session/list: cwd is longer than {MAX_CWD_CHARS} characters")
        cursor = params.get("cursor")
        if cursor is None:
            return cls(cwd, dict.fromkeys(ready))
        if not isinstance(cursor, str):
            raise InvalidParams("session/list: cursor must be a string")
        if len(cursor) > MAX_CURSOR_CHARS:
            raise InvalidParams("session/list: invalid cursor")
        pending = _decode_cursor(cursor)
        return cls(cwd, {BackendId(b): c for b, c in pending.items() if b in ready})

    def asked(self, listable: Collection[BackendId]) -> list[BackendId]:
        """The backends this page asks: those it covers that can be asked now
        (``listable``: up, and advertising ``sessionCapabilities.list``), in pool order."""
        return [b for b in self.pending if b in listable]

    def backend_params(self, backend: BackendId) -> dict[str, Any]:
        """The ``session/list`` params to send ``backend`` for this page."""
        params: dict[str, Any] = {}
        if self.cwd is not None:
            params["cwd"] = self.cwd
        cursor = self.pending.get(backend)
        if cursor is not None:
            params["cursor"] = cursor
        return params

    def merge(self, results: Mapping[BackendId, Any]) -> dict[str, Any]:
        """Merge each backend's result (in pool order), dropping repeated session ids.

        Backends sharing one store list the same sessions; the first backend that lists
        a session wins.
        """
        sessions: list[Any] = []
        seen: set[str] = set()
        following: dict[str, str] = {}
        for backend in self.pending:
            result = results.get(backend)
            if not isinstance(result, dict):
                continue
            for info in _list(result.get("sessions")):
                session_id = info.get("sessionId") if isinstance(info, dict) else None
                if isinstance(session_id, str) and session_id not in seen:
                    seen.add(session_id)
                    sessions.append(info)
            next_cursor = result.get("nextCursor")
            if isinstance(next_cursor, str):
                following[backend] = next_cursor
        merged: dict[str, Any] = {"sessions": sessions}
        if following:
            merged["nextCursor"] = _encode_cursor(following)
        return merged


#: a backend's page that did not come: it is left out of this page (``silent``), for this
#: page only; any other failure is the client's answer
UNANSWERED = (TimeoutError, BackendLinkLost)


def listed(
    page: ListPage,
    answers: Mapping[BackendId, Any],
    members: Sequence[BackendId],
    listable: Collection[BackendId],
) -> dict[str, Any]:
    """The router's ``session/list`` answer from the backends' ``answers`` (each its
    page's result, or the exception its call ended with).

    A backend that did not answer in time or whose link was lost (:data:`UNANSWERED`:
    silent) is left out of the page and named in ``_meta.unlistedBackends``, in pool
    order, with the other ``members`` the router could not ask (not ``listable``: not up,
    or not listing); when no backend that lists answered, the client gets the retryable
    ``-32012``. Any other exception (a backend's refusal, in its own words) is raised.
    """
    results: dict[BackendId, Any] = {}
    silent: list[BackendId] = []
    for backend, answer in answers.items():
        if isinstance(answer, UNANSWERED):
            silent.append(backend)
        elif isinstance(answer, BaseException):
            raise answer
        else:
            results[backend] = answer
    if silent and not results:
        raise LocateInconclusive(
            "No agent backend answered session/list in time; retry later",
            {"backends": silent},
        )
    merged = page.merge(results)
    missing = [b for b in members if b not in listable or b in silent]
    if missing:  # their sessions are missing from the page: say whose
        merged["_meta"] = {"unlistedBackends": missing}
    return merged


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _encode_cursor(pending: Mapping[str, str]) -> str:
    raw = dumps({"v": _CURSOR_VERSION, "b": dict(pending)}).encode()  # backends' cursors: any text
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str) -> dict[str, str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4))
        data = loads(raw)
    except (binascii.Error, ValueError):
        raise InvalidParams("session/list: invalid cursor") from None
    pending = data.get("b") if isinstance(data, dict) and data.get("v") == _CURSOR_VERSION else None
    if not isinstance(pending, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in pending.items()
    ):
        raise InvalidParams("session/list: invalid cursor")
    return pending


# -- capabilities ----------------------------------------------------------------------------------

#: session capabilities the router advertises when any backend has them (see below)
_ANY_BACKEND = ("list", "resume")

ROUTER_INFO = {"name": "acp-router", "title": "acp-router", "version": __version__}


def merge_capabilities(results: Sequence[Any]) -> dict[str, Any]:
    """The ``initialize`` result the router gives clients.

    A capability is advertised only when every backend that has ever answered
    ``initialize`` advertises it, so a client never calls a method some instance lacks,
    with three exceptions. ``sessionCapabilities.status`` is always there (the router
    answers it from the pool), ``list`` whenever any backend lists, and the ways back
    into a session (``loadSession``, ``sessionCapabilities.resume``) whenever any backend
    has them: a session lives on one backend, so one backend without ``resume`` must not
    take it away from the sessions on all the others. A resume of a session on a backend
    without it gets that backend's ``-32601``, and the client can fall back.
    """
    agents = [_object(r.get("agentCapabilities")) for r in results if isinstance(r, dict)]
    auth_methods: list[Any] = next(
        (
            r["authMethods"]
            for r in results
            if isinstance(r, dict) and isinstance(r.get("authMethods"), list)
        ),
        [],
    )
    session_sets = [acp.session_capabilities({"agentCapabilities": a}) for a in agents]
    session_caps: dict[str, Any] = {
        name: {}
        for name in _common(set(caps) for caps in session_sets)
        if all(isinstance(caps.get(name), dict) for caps in session_sets)
    }
    for name in _ANY_BACKEND:
        if any(isinstance(caps.get(name), dict) for caps in session_sets):
            session_caps[name] = {}
    session_caps["status"] = {}
    capabilities: dict[str, Any] = {
        "loadSession": any(a.get("loadSession") is True for a in agents),
        "promptCapabilities": _common_flags(a.get("promptCapabilities") for a in agents),
        "mcpCapabilities": _common_flags(a.get("mcpCapabilities") for a in agents),
        "sessionCapabilities": session_caps,
    }
    return {
        "protocolVersion": acp.PROTOCOL_VERSION,
        "agentCapabilities": capabilities,
        "agentInfo": ROUTER_INFO,
        "authMethods": auth_methods,
    }


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _common(sets: Iterable[set[str]]) -> set[str]:
    sets = list(sets)
    return set.intersection(*sets) if sets else set()


def _common_flags(objects: Iterable[Any]) -> dict[str, bool]:
    dicts = [_object(o) for o in objects]
    names = _common(set(d) for d in dicts)
    return (
        {name: all(d.get(name) is True for d in dicts) for name in sorted(names)} if dicts else {}
    )
