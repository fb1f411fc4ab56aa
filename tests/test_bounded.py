"""What the router keeps is bounded by what it serves (issue 17), on real sockets:

* every series and table keyed by a backend leaves with the backend (DNS discovery with
  pod addresses swaps backends all day);
* the admin status page reads a cached view: a refresh costs no probe;
* a repeated resume of an unknown id is answered from a short negative memory, and
  locates are bounded per connection and per address;
* a frozen backend (it accepts TCP and answers nothing) gets no new sessions, and
  ``session/list`` answers from the others within the probe timeout, naming it.
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry

from router.core.health import Health
from router.protocol.ids import BackendId
from tests.fleet import RouterUnderTest, router_settings, start_router, start_scripted
from tests.support import AcpClient


def _series(registry: CollectorRegistry) -> int:
    return sum(len(family.samples) for family in registry.collect())


async def _inactive(session_id: str) -> dict[str, Any] | None:
    return {"status": "inactive"}


async def _swap(router: RouterUnderTest, backend_id: str, url: str) -> None:
    """Make ``backend_id`` the pool's one backend, and wait until it is up."""
    router.pool.set_static(router_settings([(backend_id, url)]))
    await router.wait_health(backend_id, Health.UP)


async def test_every_series_and_table_keyed_by_a_backend_leaves_with_it() -> None:
    async with (
        start_scripted("a", _inactive) as backend,
        start_router([("b-0", backend.url)]) as router,
    ):
        async with AcpClient.connect(router.url) as client:
            await client.initialize()
            # counters and histograms too: a probe, a resume
            assert "result" in await client.request(
                "session/resume", {"sessionId": "sess_1", "cwd": "/w"}
            )
        await router.wait_detached()
        baseline = _series(router.metrics.registry)
        for n in range(1, 201):
            await _swap(router, f"b-{n}", backend.url)
        # on the old main: from 98 to 7,698 series after 200 swaps
        assert _series(router.metrics.registry) <= baseline, "series outlived their backend"
        pool = router.pool
        assert set(pool.states) == set(pool.links) == {BackendId("b-200")}
        assert set(pool.directory.attached) <= {BackendId("b-200")}
        assert pool.directory.pinned == {}
        assert pool._retired == {}
        assert set(pool.directory.spread._fading) <= {BackendId("b-200")}
        assert set(pool.probe_seconds) <= {BackendId("b-200")}
