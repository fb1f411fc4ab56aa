"""``python -m router``: the same as the ``acp-router`` command."""

from router.commands.cli import main

raise SystemExit(main())
