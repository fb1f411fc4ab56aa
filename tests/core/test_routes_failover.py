"""router.core.routes with ``[failover]``: a session whose link is lost waits, its frames
held, until its backend's health is known; then it is resumed where it lives now, by the
router itself, or its frames go on as for a session not attached here
(router.core.failover; tests.routes_driver plays the shell)."""

from __future__ import annotations

import orjson
import pytest

from router.core.effects import (
    AskPool,
    AwaitBackend,
    Detach,
    FailedOver,
    Locate,
    MovedAway,
    Query,
    Resumed,
    ResumeSent,
    Send,
)
from router.core.health import Health
from router.core.routes import Limits
from router.protocol.errors import NoBackendAvailable
from tests.routes_driver import (
    Client,
    as_request,
    error,
    error_reply,
    new_params,
    request,
    result,
    sid,
)

#: a lost link fails its calls at once (no session waits for a failover)
NO_FAILOVER = Limits(failover=False)


def orphaned(client: Client) -> Client:
    """``s1`` made on ``a``, whose link is then lost: one AwaitBackend, nothing else."""
    client.new_session(1, "a", "s1")
    assert client.lost("a") == (AwaitBackend("a", ("s1",)),)
    assert client.changes[-1] == Detach("s1", "a")
    return client


@pytest.mark.parametrize("health", [Health.UP, Health.GONE])
def test_with_failover_a_lost_sessions_frames_wait_and_it_is_resumed_quietly(
    health: Health,
) -> None:
    client = Client(Limits(failover=True))
    client.new_session(1, "a", "s1")
    client.send(request(2, "session/prompt", sid("s1", prompt=[])))
    failed, waits = client.lost("a")
    error_reply(failed, 2, -32013)
    assert waits == AwaitBackend("a", ("s1",))  # after the one error
    assert client.changes[-1] == Detach("s1", "a")
    # the client's next prompt waits for the failover
    assert client.send(request(3, "session/prompt", sid("s1", prompt=[]))) == ()
    *fence, locate = client.backend_known("a", ("s1",), health)
    # a backend given up may come back as the same process: it is asked about s1 first
    assert fence == ([MovedAway("a", ("s1",))] if health is Health.GONE else [])
    assert isinstance(locate, Locate)
    assert (locate.session_id, locate.tried, locate.internal) == ("s1", (), True)
    resume = orjson.loads(locate.request.text)
    assert resume["method"] == "session/resume"
    assert resume["params"] == {**new_params(), "sessionId": "s1"}  # the new session's params
    assert str(resume["id"]).startswith("acp-router:failover:")
    again = client.backend_known("a", ("s1",), health)
    assert not any(isinstance(e, Locate) for e in again)  # resumed once
    assert client.located(resume["id"], "b") == (ResumeSent(), Send("b", locate.request.text))
    # the client never sees this answer; its prompt goes where the session is now
    assert client.backend("b", result(resume["id"], {})) == (
        Resumed("b", "ok"),
        FailedOver("ok", "s1"),
        Send("b", request(3, "session/prompt", sid("s1", prompt=[]))),
    )
    assert client.routes.attached() == {"s1": "b"}
    assert list(client.routes.calls) == [3]


def test_a_failover_given_up_lets_the_frames_go_as_unattached() -> None:
    client = orphaned(Client(Limits(failover=True)))
    assert client.send(request(2, "session/prompt", sid("s1"))) == ()
    timeout, answer = client.backend_known("a", ("s1",), Health.UNKNOWN)
    assert timeout == FailedOver("timeout", "s1")
    error_reply(answer, 2, -32010)
    assert client.backend_known("a", ("s1",), Health.UP) == ()  # no failover after all


def test_a_failover_that_finds_no_home_answers_nothing_and_releases_the_frames() -> None:
    client = orphaned(Client(Limits(failover=True)))
    assert client.send(request(2, "session/prompt", sid("s1"))) == ()
    fence, locate = client.backend_known("a", ("s1",), Health.GONE)
    assert fence == MovedAway("a", ("s1",))
    assert isinstance(locate, Locate)
    assert client.routes.calls[locate.request.id].internal
    ended, answer = client.fail(locate.request.id, NoBackendAvailable())
    assert ended == FailedOver("failed", "s1")  # nothing for the client: it did not ask
    error_reply(answer, 2, -32010)


def test_a_failover_resume_not_found_is_located_again_and_stays_quiet() -> None:
    client = orphaned(Client(Limits(failover=True, max_resume_attempts=2)))
    (locate,) = client.backend_known("a", ("s1",), Health.UP)
    assert isinstance(locate, Locate)
    rid = locate.request.id
    client.located(rid, "b")
    (*_, again) = client.backend("b", error(rid, -32002))
    assert again == Locate(locate.request, "s1", ("b",), internal=True)
    client.located(rid, "c")
    assert client.backend("c", error(rid, -32002)) == (
        Resumed("c", "not_found"),
        FailedOver("failed", "s1"),
    )
    assert list(client.routes.calls) == []
    assert client.routes.attached() == {}


def test_a_failover_resume_whose_link_is_lost_ends_quietly() -> None:
    client = orphaned(Client(Limits(failover=True)))
    (locate,) = client.backend_known("a", ("s1",), Health.UP)
    assert isinstance(locate, Locate)
    client.located(locate.request.id, "b")
    assert client.lost("b") == (Resumed("b", "link_lost"), FailedOver("failed", "s1"))
    assert list(client.routes.calls) == []


def test_without_failover_nothing_is_orphaned() -> None:
    client = Client(NO_FAILOVER)
    client.new_session(1, "a", "s1")
    assert client.lost("a") == ()  # no AwaitBackend
    assert client.changes[-1] == Detach("s1", "a")
    error_reply(client.send(request(2, "session/prompt", sid("s1"))), 2, -32010)


def test_a_status_of_an_orphaned_session_is_answered_from_the_pool_at_once() -> None:
    """Read-only: it need not wait for the failover, as a prompt does; once the
    failover's resume is out, it waits behind that like any frame."""
    client = orphaned(Client(Limits(failover=True)))
    assert client.send(request(2, "session/prompt", sid("s1"))) == ()
    status = request(3, "session/status", sid("s1"))
    assert client.send(status) == (AskPool(Query.STATUS, as_request(status), "s1"),)
    (locate,) = client.backend_known("a", ("s1",), Health.UP)
    assert isinstance(locate, Locate)
    assert client.send(request(4, "session/status", sid("s1"))) == ()
