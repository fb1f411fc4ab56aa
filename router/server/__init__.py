"""The router's aiohttp shell: the front door (:mod:`.app`), one client connection
(:mod:`.client`), its links to backends (:mod:`.backend_link`), the pool and its
control links (:mod:`.pool`, :mod:`.control`), metrics and configuration.

It carries out what :mod:`router.core` decides and owns every socket, task and timer.
"""
