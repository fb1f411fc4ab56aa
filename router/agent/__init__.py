"""The reference ACP agent: echoes prompts, names its instance, persists sessions.

``store`` keeps sessions on disk (plain file I/O), ``paging`` pages ``session/list``,
``params`` reads request params, ``sessions`` is the in-memory session table,
``turns`` runs one prompt turn, ``connection`` is one client connection,
``methods`` answers each ACP method, and ``server`` is the aiohttp shell.
"""
