"""Where the router's secrets come from (router.server.door.auth, router.server.links.tls): every
failure is one ConfigError naming the key, and never quoting a secret."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.core.frontdoor import AuthOutcome
from router.protocol.errors import ConfigError
from router.server.config import AuthSection, BackendSection, RouterSection
from router.server.door.auth import TokenSource, session_secret
from router.server.links.tls import backend_context, server_context


def auth(**fields: Any) -> AuthSection:
    return AuthSection.model_validate(fields)


def test_tokens_from_every_source_together(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("  file-token  \n# a comment\n\n", encoding="utf-8")
    source = TokenSource(
        auth(tokens=["inline-token"], tokens_file=str(tokens), token_env="T"),
        {"T": "env-1,env-2 env-3"},
    )
    assert source.credentials is not None
    assert len(source.credentials) == 5
    for token in ("inline-token", "file-token", "env-1", "env-3"):
        assert source.credentials.check(f"Bearer {token}")[0] is AuthOutcome.OK
    assert TokenSource(None).credentials is None  # no [auth]: open


def test_a_failed_reload_keeps_the_tokens_in_use(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text("secret-one\n", encoding="utf-8")
    source = TokenSource(auth(tokens_file=str(tokens)))
    tokens.write_text("# emptied by mistake\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="hold no token"):
        source.reload()
    assert source.credentials is not None
    assert source.credentials.check("Bearer secret-one")[0] is AuthOutcome.OK
    tokens.unlink()
    with pytest.raises(ConfigError, match=r"^auth\.tokens_file: cannot read ") as caught:
        source.reload()
    assert "secret-one" not in str(caught.value)


def test_an_unset_token_variable_is_no_token() -> None:
    with pytest.raises(ConfigError, match="hold no token"):
        TokenSource(auth(token_env="UNSET_VARIABLE"), {})


def test_the_session_secret_from_each_source(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_text("file secret of some length\n", encoding="utf-8")
    bound = {"tokens": ["t"], "bind_sessions": True}
    assert session_secret(auth(**bound, session_secret="inline secret, long")) == (
        b"inline secret, long"
    )
    from_file = session_secret(auth(**bound, session_secret_file=str(secret)))
    assert from_file == b"file secret of some length"
    from_env = session_secret(auth(**bound, session_secret_env="S"), {"S": "env secret, 16 bytes"})
    assert from_env == b"env secret, 16 bytes"
    assert session_secret(auth(tokens=["t"], session_secret="not used when unbound")) is None
    with pytest.raises(ConfigError, match=r"^auth\.session_secret_env: .*16 bytes"):
        session_secret(auth(**bound, session_secret_env="S"), {"S": "short"})
    with pytest.raises(ConfigError, match=r"^auth\.session_secret_file: cannot read"):
        session_secret(auth(**bound, session_secret_file=str(tmp_path / "missing")))


def test_bad_pem_files_name_their_key(tmp_path: Path) -> None:
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n", encoding="utf-8")
    router = RouterSection.model_validate({"tls_cert": str(junk), "tls_key": str(junk)})
    with pytest.raises(ConfigError, match=r"^router\.tls_cert/tls_key: "):
        server_context(router)
    assert server_context(RouterSection()) is None
    backend = BackendSection.model_validate(
        {"id": "a", "url": "wss://a.internal/acp", "tls_ca": str(tmp_path / "missing.pem")}
    )
    with pytest.raises(ConfigError, match=r"^backends\.a\.tls_ca: "):
        backend_context(backend)
    plain = BackendSection.model_validate({"id": "a", "url": "ws://a.internal/acp"})
    assert backend_context(plain) is None
