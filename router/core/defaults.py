"""The default of every setting the core takes, written once: the core's dataclasses
(:class:`router.core.calls.Limits`, :class:`router.core.directory.Bounds`) and the
config model (``router/server/config.py``) both read them, so a core built with its
defaults is the router a config file without those keys deploys
(``tests/server/test_config.py`` holds the two equal)."""

from __future__ import annotations

from typing import Final

# -- [router]: one client connection's tables ----------------------------------------------------

MAX_IN_FLIGHT_PER_CONNECTION: Final = 1024
#: sessions attached, counting those a call in flight may attach
MAX_SESSIONS_PER_CONNECTION: Final = 1024
#: longest ``sessionId`` routed
MAX_SESSION_ID_CHARS: Final = 1024
#: a prompt turn its connection left running is cancelled on its backend
CANCEL_ABANDONED_TURNS: Final = True

# -- [failover] ----------------------------------------------------------------------------------

#: a session whose link is lost waits until it is resumed where it lives now
FAILOVER_ENABLED: Final = True

# -- [cache] and [placement]: what the directory keeps, in seconds -------------------------------

CACHE_MAX_ENTRIES: Final = 100_000
CACHE_TTL_SECONDS: Final = 30.0
CACHE_REMEMBER_SECONDS: Final = 86_400.0
CACHE_NEGATIVE_SECONDS: Final = 5.0
PLACEMENT_DECAY_SECONDS: Final = 300.0

# -- the core's own, with no config key ---------------------------------------------------------

#: agent requests awaiting the client's answer on one connection
MAX_AGENT_REQUESTS: Final = 1024
#: backends one resume or load may be forwarded to before the -32002 stands
MAX_RESUME_ATTEMPTS: Final = 8
