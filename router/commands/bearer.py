"""The client side of the router's bearer tokens: ``connect`` and ``status`` send
``Authorization: Bearer <token>`` when ``ACP_ROUTER_TOKEN`` is set (an environment
variable rather than a flag, so the token stays out of process listings)."""

from __future__ import annotations

import os
from collections.abc import Mapping

TOKEN_ENV = "ACP_ROUTER_TOKEN"


def auth_headers(environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    token = (os.environ if environ is None else environ).get(TOKEN_ENV, "").strip()
    return {"Authorization": f"Bearer {token}"} if token else None


def refusal_hint(status: int, environ: Mapping[str, str] | None = None) -> str:
    """What to add to the report of an HTTP refusal: a 401 is about the token, which was
    either not sent (the variable unset) or not accepted."""
    if status != 401:
        return ""
    if auth_headers(environ) is None:
        return f": set {TOKEN_ENV} to a token the router accepts"
    return f": the router does not accept the token in {TOKEN_ENV}; set it to one it accepts"
