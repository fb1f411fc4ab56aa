"""What the shell found out, for one client connection's calls: the outcome of the work
that waited on the pool (``initialize``'s capabilities, a placement, a locate, the pool's
own answer or error), turned into effects, sans-I/O. The rules are
:mod:`router.core.routes`'s."""

from __future__ import annotations

from typing import Any

from router.core.client_side import ClientSide
from router.core.effects import NOTHING, Effects, FailedOver, Forwarded, Reply, ResumeSent, refusal
from router.protocol import acp
from router.protocol.errors import ErrorObject, JsonRpcError
from router.protocol.ids import BackendId
from router.protocol.jsonrpc import RequestId, encode_result
from router.protocol.splice import put_member

#: where a resume carries its epoch
EPOCH_PATH = ("params", "_meta", acp.EPOCH_META_KEY)


def initialized(
    routes: ClientSide, request_id: RequestId, capabilities: Any, only: BackendId | None = None
) -> Effects:
    """Answer ``initialize`` with what the router advertises; in a pool of one (``only``),
    whatever the client does next goes there, so its link opens now."""
    ahead = routes.open_ahead(None, only) if only is not None else NOTHING
    return (*ahead, *answer(routes, request_id, capabilities))


def placed(routes: ClientSide, request_id: RequestId, backend: BackendId) -> Effects:
    """:class:`~router.core.effects.Place`: a new session (or, on a connection with no
    link yet, its ``authenticate``) goes to ``backend``."""
    call = routes.calls.get(request_id)
    if call is None:  # answered meanwhile (the router is stopping)
        return routes.gone(request_id, "a placement")
    if call.request.method == acp.AUTHENTICATE:
        return routes.authenticate_on(call.request, [backend])
    return located(routes, request_id, backend)


def located(
    routes: ClientSide, request_id: RequestId, backend: BackendId, epoch: int | None = None
) -> Effects:
    """:class:`~router.core.effects.Locate` found ``backend``: forward the call there (a
    link opened ahead elsewhere for it is closed). A resume or load carries ``epoch``
    in ``params._meta`` (:data:`router.protocol.acp.EPOCH_META_KEY`), the fencing token
    its copy keeps there (:mod:`router.core.split_brain`)."""
    call = routes.calls.get(request_id)
    if call is None:  # answered meanwhile (the router is stopping)
        return routes.gone(request_id, "a location")
    routes.routed(request_id, call, backend)
    text = call.request.text
    if epoch is not None and call.request.method in acp.ATTACHING:
        text = put_member(text, EPOCH_PATH, epoch)
    sent = routes.send(backend, text)
    if call.observed:
        sent = (Forwarded(call.request, backend), *sent)
    closed = routes.links.done(request_id)
    if call.request.method in acp.ATTACHING:
        return (ResumeSent(retry=bool(call.tried)), *sent, *closed)
    return (*sent, *closed)


def replaced(
    routes: ClientSide, request_id: RequestId, unanswered: BackendId, backend: BackendId
) -> Effects:
    """A ``session/new`` placed on ``unanswered``, which left it unanswered past its
    deadline (its probe went unanswered: it is silent), goes to ``backend`` instead;
    ``unanswered``'s late answer, if it comes, is not the client's
    (:func:`router.core.backend_side.receive`: the session it made is closed). Nothing,
    when the call was answered meanwhile or is not that ``session/new`` there."""
    call = routes.calls.get(request_id)
    if call is None or call.backend != unanswered or call.request.method != acp.SESSION_NEW:
        return NOTHING
    routes.left_unanswered(request_id, unanswered)
    return located(routes, request_id, backend)


def answer(routes: ClientSide, request_id: RequestId, result: Any) -> Effects:
    """The router's own answer to a call in flight (nothing, once it was answered)."""
    if request_id not in routes.calls:
        return routes.gone(request_id, "an answer")
    return routes.conclude(request_id, (Reply(encode_result(request_id, result), request_id),))


def fail(routes: ClientSide, request_id: RequestId, error: JsonRpcError | ErrorObject) -> Effects:
    """The router's error answer to a call in flight; for a call the router made itself,
    its quiet end (nothing, once it was answered)."""
    call = routes.calls.get(request_id)
    if call is None:
        return routes.gone(request_id, "an error")
    if call.internal:
        return routes.conclude(request_id, (FailedOver("failed", call.session_id),))
    return routes.conclude(request_id, (refusal(request_id, error),))
