"""The front door's decisions and the quotas, sans-I/O: tokens, origins, per-address
connection counts and token buckets under an explicit clock."""

from __future__ import annotations

import pytest

from router.core.frontdoor import (
    ANONYMOUS,
    Admitted,
    AuthOutcome,
    Credentials,
    Denied,
    DoorPolicy,
    bearer_token,
    normal_origin,
    principal_of,
)
from router.core.quotas import (
    Client,
    ClientPlaces,
    ConnectionCounts,
    Full,
    RateTable,
    SessionQuota,
    Taken,
    TokenBucket,
)

CREDENTIALS = Credentials.of(["alpha-token", "bravo-token"])


@pytest.mark.parametrize(
    ("header", "outcome"),
    [
        (None, AuthOutcome.MISSING),
        ("", AuthOutcome.MISSING),
        ("Bearer", AuthOutcome.MISSING),
        ("Bearer    ", AuthOutcome.MISSING),
        ("Basic alpha-token", AuthOutcome.MISSING),
        ("alpha-token", AuthOutcome.MISSING),
        ("Bearer alpha-toke", AuthOutcome.WRONG),
        ("Bearer alpha-token2", AuthOutcome.WRONG),
        ("Bearer ALPHA-TOKEN", AuthOutcome.WRONG),
        ("Bearer alpha-token", AuthOutcome.OK),
        ("bearer bravo-token", AuthOutcome.OK),
        ("BEARER  bravo-token ", AuthOutcome.OK),
    ],
)
def test_bearer_tokens(header: str | None, outcome: AuthOutcome) -> None:
    got, principal = CREDENTIALS.check(header)
    assert got is outcome
    assert (principal is not None) == (outcome is AuthOutcome.OK)


def test_a_principal_is_a_stable_fingerprint_not_the_token() -> None:
    _, alpha = CREDENTIALS.check("Bearer alpha-token")
    _, bravo = CREDENTIALS.check("Bearer bravo-token")
    assert alpha == principal_of("alpha-token") != bravo
    assert alpha is not None
    assert "alpha" not in alpha
    assert "alpha-token" not in repr(CREDENTIALS)


def test_no_tokens_lets_nobody_in() -> None:
    assert Credentials.of([]).check("Bearer anything")[0] is AuthOutcome.WRONG
    assert len(Credentials.of(["a", "a", "b"])) == 2
    assert bearer_token("Bearer x y") == "x y"


@pytest.mark.parametrize(
    ("origin", "normal"),
    [
        ("https://Editor.Example", "https://editor.example"),
        ("https://editor.example:443", "https://editor.example"),
        ("http://editor.example:80", "http://editor.example"),
        ("http://localhost:3000", "http://localhost:3000"),
        ("http://[::1]:8080", "http://[::1]:8080"),
        ("null", "null"),
        ("http://h:99999", "http://h:99999"),
    ],
)
def test_origins_compare_by_scheme_host_and_port(origin: str, normal: str) -> None:
    assert normal_origin(origin) == normal


def test_the_door_checks_origin_then_token() -> None:
    door = DoorPolicy.of(["https://editor.example"])
    cross_site = door.admit("https://evil.example", "Bearer alpha-token", CREDENTIALS)
    assert isinstance(cross_site, Denied)
    assert (cross_site.status, cross_site.reason, cross_site.auth) == (
        403,
        "forbidden_origin",
        None,
    )
    missing = door.admit(None, None, CREDENTIALS)
    assert isinstance(missing, Denied)
    assert (missing.status, missing.auth) == (401, AuthOutcome.MISSING)
    ok = door.admit("https://EDITOR.example", "Bearer alpha-token", CREDENTIALS)
    assert ok == Admitted(principal_of("alpha-token"), AuthOutcome.OK)
    assert door.admit(None, None, None) == Admitted(ANONYMOUS, AuthOutcome.OPEN)
    assert isinstance(DoorPolicy.of([]).admit("http://127.0.0.1", None, None), Denied)
    assert isinstance(DoorPolicy.of(["*"]).admit("http://any.where", None, None), Admitted)


def test_connection_counts_per_address() -> None:
    counts = ConnectionCounts(per_address=2)
    assert counts.open("a")
    assert counts.open("a")
    assert not counts.open("a")
    assert counts.open("b")
    counts.close("a")
    assert counts.open("a")
    for address in ("a", "a", "b"):
        counts.close(address)
    assert len(counts) == 0  # nothing kept for addresses with no connection


ALPHA, BRAVO = (
    Client.of(principal_of("alpha"), "10.0.0.1"),
    Client.of(principal_of("bravo"), "10.0.0.1"),
)


def taken(places: ClientPlaces, client: Client) -> Taken:
    place = places.take(client)
    assert isinstance(place, Taken), place
    return place


def test_a_client_is_its_token_with_credentials_and_its_address_without() -> None:
    assert Client("principal", principal_of("alpha")) == ALPHA
    assert ALPHA != BRAVO  # one address, two tokens: two clients
    assert Client.of(ANONYMOUS, "10.0.0.1") == Client("address", "10.0.0.1")


def test_each_client_has_its_share_and_idle_places_make_room_for_others() -> None:
    places = ClientPlaces(per_principal=3, per_address=1, most=4)
    alphas = [taken(places, ALPHA).place for _ in range(3)]
    assert places.take(ALPHA) == Full("principal")  # its share, idle or not
    for place in alphas:
        places.rest(place)
    assert places.take(ALPHA) == Full("principal")  # never renewed past its share
    first = taken(places, BRAVO)
    assert first.reclaimed == ()  # room left in all
    second = taken(places, BRAVO)  # the ceiling: alpha, which holds the most, gives one
    assert second.reclaimed == (alphas[0],)  # the longest idle
    places.use(alphas[1])
    places.use(alphas[2])
    # now bravo holds two, alpha two in use: nothing idle to give
    assert places.take(BRAVO) == Full("process")
    places.give_back(alphas[0])  # the reclaimed connection ends: counted once only
    assert (places.open, places.count(ALPHA), places.count(BRAVO)) == (4, 2, 2)
    anonymous = Client.of(ANONYMOUS, "10.0.0.9")
    for place in (first.place, second.place, alphas[1]):
        places.give_back(place)
    assert taken(places, anonymous).reclaimed == ()
    assert places.take(anonymous) == Full("address")


def test_a_token_bucket_refills_with_time() -> None:
    bucket = TokenBucket.full(per_minute=60, now=100.0)
    for _ in range(60):
        assert bucket.retry_after(100.0) == 0
        bucket.take()
    assert bucket.retry_after(100.0) == pytest.approx(1.0)
    assert bucket.retry_after(100.5) == pytest.approx(0.5)
    assert bucket.retry_after(101.0) == 0
    assert bucket.retry_after(10_000.0) == 0
    assert bucket.tokens == 60  # never above its capacity


def test_session_quota_per_address_and_in_all() -> None:
    quota = SessionQuota(per_address=2, in_all=3, max_addresses=100)
    assert quota.admit("a", 0.0) is None
    assert quota.admit("a", 0.0) is None
    assert quota.admit("a", 0.0) == ("address", 30.0)
    assert quota.admit("b", 0.0) is None
    scope, wait = quota.admit("c", 0.0) or ("", 0.0)
    assert scope == "process"
    assert wait == pytest.approx(20.0)
    # a refusal by the process limit did not spend c's own token
    assert quota.addresses.bucket("c", 0.0).tokens == 2
    assert quota.admit("a", 30.0) is None  # both refilled enough


def test_the_rate_table_is_bounded() -> None:
    table = RateTable(per_minute=1, max_keys=3)
    for key in "abcde":
        table.bucket(key, 0.0).take()
    assert len(table) == 3
    table.bucket("c", 0.0)  # used: kept over d
    table.bucket("f", 0.0)
    assert len(table) == 3
    assert table.bucket("c", 0.0).tokens == 0  # still the spent bucket
    assert table.bucket("a", 0.0).tokens == 1  # pushed out long ago: a fresh bucket
