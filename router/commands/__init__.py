"""The ``acp-router`` command line: :mod:`.cli` dispatches to ``serve``, ``agent``,
``demo``, ``status`` and ``connect``."""
