"""router.core.routes under random traffic: every client request is answered exactly once,
with and without failover (tests.routes_model), and no frame makes the core raise."""

from __future__ import annotations

from typing import Any

import orjson
from hypothesis import given, settings, strategies as st

from router.core.effects import (
    AskPool,
    AwaitBackend,
    Deliver,
    Effect,
    Effects,
    Initialize,
    Locate,
    Place,
    Reply,
)
from router.core.health import Health
from router.core.routes import ClientRoutes, Limits
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import RequestId
from router.protocol.reading import parse
from tests.routes_driver import error, notification, request, result
from tests.routes_ledger import METHODS
from tests.routes_model import STEPS, Model

_STEP = st.tuples(st.sampled_from(STEPS), st.integers(0, 2**24 - 1))


def _run(model: Model, steps: list[Any]) -> None:
    for step, choice in steps:
        model.step(step, choice & 0xFF, (choice >> 8) & 0xFF, choice >> 16)
    model.finish()


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, min_size=30, max_size=90))
def test_every_request_is_answered_exactly_once(steps: list[Any]) -> None:
    _run(Model(), steps)


_FAILOVER_STEP = st.tuples(
    st.sampled_from((*STEPS, Model.shell_fails_over, Model.shell_fails_over)),
    st.integers(0, 2**24 - 1),
)


@settings(max_examples=200, deadline=None)
@given(st.lists(_FAILOVER_STEP, min_size=30, max_size=90))
def test_with_failover_every_request_is_still_answered_exactly_once(steps: list[Any]) -> None:
    _run(Model(failover=True), steps)


# -- nothing a peer sends makes the core raise -----------------------------------------------------

_ANY_VALUE: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 3)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from(["s1", "a", ""]),
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(
            st.sampled_from(["sessionId", "requestId", "cwd", "_meta", "x"]), children, max_size=3
        )
    ),
    max_leaves=4,
)
_ANY_PARAMS: st.SearchStrategy[Any] = (
    st.none()
    | st.lists(_ANY_VALUE, max_size=2)
    | st.dictionaries(st.sampled_from(["sessionId", "requestId", "cwd"]), _ANY_VALUE, max_size=3)
)
_ANY_METHOD = st.sampled_from(
    [
        *dict.fromkeys(METHODS),
        "authenticate",
        "session/cancel",
        "$/cancel_request",
        "session/update",
        "fs/x",
    ]
)
_ANY_ID: st.SearchStrategy[RequestId] = st.integers(0, 3) | st.sampled_from(["a", "0"])
_ANY_FRAME = st.one_of(
    st.builds(request, _ANY_ID, _ANY_METHOD, _ANY_PARAMS),
    st.builds(notification, _ANY_METHOD, _ANY_PARAMS),
    st.builds(result, _ANY_ID, _ANY_VALUE),
    st.builds(error, _ANY_ID, st.sampled_from([-32002, -32603]), _ANY_VALUE),
)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["client", "a", "b", "lost", "shell"]), _ANY_FRAME), max_size=12
    ),
    st.booleans(),
)
def test_no_frame_makes_the_core_raise(steps: list[tuple[str, str]], failover: bool) -> None:
    routes = ClientRoutes(
        Limits(max_in_flight=3, max_sessions=2, max_agent_requests=2, failover=failover)
    )
    work: list[Effect] = []  # what the shell has yet to do

    def carry_out(effects: Effects) -> None:
        for effect in effects:
            if isinstance(effect, Reply):  # an error the router makes says its code as data
                error = orjson.loads(effect.text).get("error")
                assert effect.error == (None if error is None else error["code"])
            elif isinstance(effect, Initialize | Place | Locate | AskPool | AwaitBackend):
                work.append(effect)

    for who, text in steps:
        message = parse(text)
        if who == "client":
            carry_out(routes.receive_client(message))
        elif who == "lost":
            carry_out(routes.backend_lost(BackendId("a")))
        elif who == "shell":  # the pool finds every piece of work a home on a
            todo, work[:] = list(work), []
            for effect in todo:
                carry_out(_shell_does(routes, effect))
        else:
            relayed = routes.relays(message)
            effects = routes.receive_backend(BackendId(who), message)
            if relayed:  # the shell delivers such a frame without asking receive_backend
                assert effects == (Deliver(message.text),), (text, effects)
            carry_out(effects)


def _shell_does(routes: ClientRoutes, work: Effect) -> Effects:
    a = BackendId("a")
    match work:
        case Initialize(call):
            return routes.initialized(call.id, {}, a)
        case Place(call):
            return routes.placed(call.id, a)
        case Locate(call):
            return routes.located(call.id, a)
        case AskPool(_, call):
            return routes.answer(call.id, {})
        case AwaitBackend(backend, sessions):
            return routes.backend_known(backend, sessions, Health.UP)
    raise AssertionError(work)
