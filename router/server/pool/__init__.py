"""The pool of backends, as the I/O shell drives it: :mod:`.backends` (the control links,
probes and waits around the core's :class:`~router.core.fleet.Fleet`), :mod:`.locator`
(locates and the split-brain audit), :mod:`.queries` (the pool-wide ``session/status``
and ``session/list``), and :mod:`.upstream`, which puts them together. Each imports only
those before it in that list.
"""
