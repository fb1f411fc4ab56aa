"""The router's asyncio shell (its own WebSocket for clients and links, aiohttp for the
HTTP surfaces): the front door (:mod:`.app`, :mod:`.accepting`), one client connection
(:mod:`.client`), its links to backends (:mod:`.backend_link`), the pool and its
control links (:mod:`.pool`, :mod:`.control`), metrics and configuration.

It carries out what :mod:`router.core` decides and owns every socket, task and timer.
"""
