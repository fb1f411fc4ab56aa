"""Where the router's secrets come from: client tokens (inline, a file, an environment
variable) and the session-binding key. The checks themselves are sans-I/O
(:mod:`router.core.frontdoor`); this module only reads.

Tokens never appear in a log line or an error message: errors name the key and the
file or variable, and say how many tokens were read.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Mapping

from router.core.frontdoor import Credentials
from router.protocol.errors import ConfigError
from router.server.config import AuthSection, TokenSection

logger = logging.getLogger(__name__)

_SEPARATORS = re.compile(r"[\s,]+")


class TokenSource:
    """The tokens a section (``[auth]``, ``[admin]``: ``key``) names, read now and again
    on :meth:`reload`; with no such section, :attr:`credentials` is None: the door is open.

    :attr:`credentials` is replaced whole on reload, so a check in progress sees
    either the old set or the new one, never a mix.
    """

    def __init__(
        self,
        section: TokenSection | None,
        environ: Mapping[str, str] | None = None,
        *,
        key: str = "auth",
    ) -> None:
        self._section = section
        self._environ = os.environ if environ is None else environ
        self._key = key
        self.credentials = self.read(section)

    def reload(self) -> Credentials | None:
        """Read every source again (e.g. after the tokens file changed).

        Raises:
            ConfigError: a source cannot be read or no token is left; the tokens in use
                stay as they were.
        """
        return self.use(self._section, self.read(self._section))

    def use(
        self, section: TokenSection | None, credentials: Credentials | None
    ) -> Credentials | None:
        """Switch to ``section``'s sources and the ``credentials`` :meth:`read` made of
        them (a config reload reads first, while the old tokens still hold, then switches)."""
        self._section, self.credentials = section, credentials
        if credentials is not None:
            logger.info("%s: %d token(s) loaded", self._key, len(credentials))
        return credentials

    def read(self, section: TokenSection | None) -> Credentials | None:
        """The tokens ``section`` names, read now; changes nothing.

        Raises:
            ConfigError: a source cannot be read or holds no token.
        """
        if section is None:
            return None
        tokens = list(section.tokens)
        if section.tokens_file is not None:
            tokens += _file_tokens(section.tokens_file, self._key)
        if section.token_env is not None:
            tokens += _SEPARATORS.split(self._environ.get(section.token_env, "").strip())
        credentials = Credentials.of(t for t in tokens if t)
        if not credentials.digests:
            raise ConfigError(f"{self._key}: tokens, tokens_file and token_env hold no token")
        return credentials


def _file_tokens(path: str, key: str) -> list[str]:
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8"
        raise ConfigError(f"{key}.tokens_file: cannot read {path}: {reason or exc}") from None
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]


def session_secret(auth: AuthSection, environ: Mapping[str, str] | None = None) -> bytes | None:
    """The key of the session-id MAC, when ``[auth]`` binds sessions.

    Raises:
        ConfigError: the file or variable is missing, or the secret is shorter than 16 bytes.
    """
    if not auth.bind_sessions:
        return None
    environ = os.environ if environ is None else environ
    if auth.session_secret is not None:
        secret, key = auth.session_secret, "auth.session_secret"
    elif auth.session_secret_file is not None:
        key = "auth.session_secret_file"
        try:
            with open(auth.session_secret_file, encoding="utf-8") as file:
                secret = file.read().strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{key}: cannot read {auth.session_secret_file}: {exc}") from None
    else:
        assert auth.session_secret_env is not None  # the config holds one of the three
        key = "auth.session_secret_env"
        secret = environ.get(auth.session_secret_env, "").strip()
    if len(secret.encode()) < 16:
        raise ConfigError(f"{key}: the session secret must be at least 16 bytes long")
    return secret.encode()
