"""The pool of backends, as the I/O shell drives it: :mod:`.backends` (the control links,
probes and waits around the core's :class:`~router.core.fleet.Fleet`), :mod:`.locator`
(locates and the split-brain audit), :mod:`.queries` (the pool-wide ``session/status``
and ``session/list``), :mod:`.waits` (waiting on a backend's health), :mod:`.healing` (stale copies closed,
returning backends fenced) and :mod:`.upstream`,
which puts them together. :mod:`.probes` sends the probe rounds for :mod:`.backends`.
Nothing imports a module that imports it.
"""
