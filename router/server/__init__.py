"""The router's asyncio shell, in rooms from the top down: running the process
(:mod:`.process`), the operator's surfaces (:mod:`.operator`), the front door
(:mod:`.door`), one client connection (:mod:`.connection`), the pool (:mod:`.pool`),
links to backends and the router's WebSocket (:mod:`.links`), and what operators see
(:mod:`.observability`); under all of them the configuration (:mod:`.config`) and the
event loop (:mod:`.loops`). docs/architecture.md names every part.

It carries out what :mod:`router.core` decides and owns every socket, task and timer.
"""
