"""acp-router: a session-aware routing proxy for the Agent Client Protocol."""

__version__ = "0.1.0"
