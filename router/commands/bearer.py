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


def refusal_hint(status: int) -> str:
    """What to add to the report of an HTTP refusal: a 401 is about the token."""
    return f": set {TOKEN_ENV} to a token the router accepts" if status == 401 else ""
