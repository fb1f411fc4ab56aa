"""The router's asyncio shell (its own WebSocket for clients and links, :mod:`.websocket`;
aiohttp for the HTTP surfaces): the application and its front door (:mod:`.app`,
:mod:`.accepting`, :mod:`.admission`, :mod:`.upgrade`, :mod:`.streamable_http`), one
client connection (:mod:`.client`), its links to backends (:mod:`.backend_link`), the
pool and its control links (:mod:`.pool`, :mod:`.control`), running it
(:mod:`.serving`), metrics and configuration. docs/architecture.md names every part.

It carries out what :mod:`router.core` decides and owns every socket, task and timer.
"""
