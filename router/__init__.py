"""acp-router: a session-aware routing proxy for the Agent Client Protocol."""

from router import native

__version__ = "0.1.0"

# the per-frame modules run compiled where a build made from these sources is here
# (router.native), from their sources otherwise
native.choose()
