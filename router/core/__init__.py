"""The routing core, sans-I/O: every routing decision, as data in and actions out.

:mod:`.placement` ranks backends for a session id; :mod:`.locate` turns probe answers
into a backend; :mod:`.routes` is one client connection's routing state; :mod:`.listing`
merges ``session/list`` pages. Nothing here does I/O, reads a clock or logs: the shell
(:mod:`router.server`) carries the actions out.
"""
