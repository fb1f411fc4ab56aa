"""router.core.ending: why the router ends a client connection itself, and which
connections a reload's tokens end (tests/e2e/test_revocation.py: on real sockets)."""

from __future__ import annotations

from router.core import ending
from router.core.frontdoor import Credentials, principal_of

ALICE, BOB = principal_of("alice-token"), principal_of("bob-token")


def test_a_reload_ends_the_connections_whose_token_it_removed_only() -> None:
    kept = Credentials.of(["alice-token"])
    assert ending.revoked(BOB, kept)
    assert not ending.revoked(ALICE, kept)
    assert not ending.revoked(None, kept)  # came without a token: a token-less door
    assert not ending.revoked(BOB, None)  # no [auth] any more: nothing to revoke


def test_a_stopping_router_asks_clients_to_come_back_and_cancels_every_turn() -> None:
    assert ending.STOPPING.code == 1012
    assert ending.STOPPING.why == "stopping"
    for closed in (ending.REVOKED, ending.no_initialize(250)):
        assert closed.code == 1008  # policy violation: not a restart to come back from
        assert closed.why == "client_gone"  # a turn another connection holds runs on
    assert ending.no_initialize(250).reason == "no initialize within 250 ms"
