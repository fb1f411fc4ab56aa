"""router.server.config: TOML settings, validated, with one error line naming the bad key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from router.core.locate import UnknownPolicy
from router.protocol.errors import ConfigError
from router.server.config import Settings, load_settings, settings_from

MINIMAL: dict[str, Any] = {"backends": [{"id": "a", "url": "ws://127.0.0.1:9001/acp"}]}


def _with(**sections: Any) -> dict[str, Any]:
    return MINIMAL | sections


def _backend(**fields: Any) -> dict[str, Any]:
    return {"backends": [{"id": "a", "url": "ws://h:1/acp"} | fields]}


def _error(data: dict[str, Any]) -> str:
    with pytest.raises(ConfigError) as caught:
        settings_from(data)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_minimal_config_takes_the_defaults() -> None:
    settings = settings_from(MINIMAL)
    assert isinstance(settings, Settings)
    assert [(b.id, b.url, b.weight) for b in settings.backends] == [
        ("a", "ws://127.0.0.1:9001/acp", 1.0)
    ]
    assert settings.router.address == ("127.0.0.1", 8765)
    assert settings.router.policy is UnknownPolicy.FAIL_CLOSED
    assert settings.probe.timeout_ms == 500
    assert settings.cache.ttl_seconds == 30.0
    assert settings.placement.decay_seconds == 300.0


def test_full_config() -> None:
    settings = settings_from(
        {
            "router": {
                "listen": "[::1]:9000",
                "unknown_policy": "place_anyway",
                "max_connections": 5,
                "max_sessions_per_connection": 3,
                "max_in_flight_per_connection": 4,
                "drain_seconds": 2,
                "compression": False,
                "connect_timeout_ms": 100,
                "max_message_bytes": 1024,
            },
            "backends": [
                {"id": "a", "url": "ws://a:1/acp", "weight": 2},
                {"id": "b", "url": "wss://b.example/acp", "weight": 0.5},
            ],
            "probe": {"timeout_ms": 250},
            "control": {"reconnect_initial_ms": 10, "reconnect_max_ms": 20, "heartbeat_seconds": 1},
            "cache": {"ttl_seconds": 5, "max_entries": 10},
            "placement": {"decay_seconds": 60},
        }
    )
    assert settings.placement.decay_seconds == 60.0
    assert settings.router.address == ("::1", 9000)
    assert settings.router.policy is UnknownPolicy.PLACE_ANYWAY
    assert [b.weight for b in settings.backends] == [2.0, 0.5]
    assert settings.control.heartbeat_seconds == 1.0


def test_security_keys() -> None:
    settings = settings_from(
        {
            "router": {
                "tls_cert": "/etc/acp/cert.pem",
                "tls_key": "/etc/acp/key.pem",
                "metrics_listen": "0.0.0.0:9100",
                "allowed_origins": ["https://editor.example", "*"],
                "max_connections_per_address": 4,
            },
            "backends": [
                {"id": "a", "url": "wss://a:1/acp", "tls_ca": "/ca.pem"},
                {"id": "b", "url": "wss://b:1/acp", "tls_cert": "/c.pem", "tls_key": "/k.pem"},
            ],
            "auth": {
                "tokens": ["secret-token"],
                "token_env": "ACP_ROUTER_TOKENS",
                "bind_sessions": True,
                "session_secret_env": "ACP_ROUTER_SESSION_SECRET",
            },
        }
    )
    assert settings.router.metrics_address == ("0.0.0.0", 9100)
    assert settings.auth is not None
    assert settings.auth.bind_sessions
    assert "secret-token" not in repr(settings)
    assert settings_from(MINIMAL).auth is None


def test_settings_are_frozen() -> None:
    settings = settings_from(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        settings.probe.timeout_ms = 1  # type: ignore[misc]


@pytest.mark.parametrize(
    ("data", "key"),
    [
        (_backend(url="http://h/acp"), "backends.0.url"),
        (_backend(url="ws:///acp"), "backends.0.url"),
        (_backend(url="not a url"), "backends.0.url"),
        (_backend(url="ws://h:99999/acp"), "backends.0.url"),
        (_backend(url="ws://h:port/acp"), "backends.0.url"),
        (_backend(url=5), "backends.0.url"),
        (_backend(id=""), "backends.0.id"),
        (_backend(id=3), "backends.0.id"),
        (_backend(weight=0), "backends.0.weight"),
        (_backend(weight=-1.5), "backends.0.weight"),
        (_backend(weight=float("inf")), "backends.0.weight"),
        (_backend(weight=float("nan")), "backends.0.weight"),
        (_backend(weight="2"), "backends.0.weight"),
        (_backend(weight=True), "backends.0.weight"),
        (_backend(wieght=2), "backends.0.wieght"),
        (
            {"backends": [{"id": "a", "url": "ws://h/acp"}, {"id": "b", "url": "ftp://h"}]},
            "backends.1.url",
        ),
        ({"backends": [{"url": "ws://h/acp"}]}, "backends.0.id"),
        ({"backends": [{"id": "a"}]}, "backends.0.url"),
        ({"backends": "ws://h/acp"}, "backends"),
        ({"backends": []}, "backends"),
        ({}, "backends"),
        (_with(router={"lisen": "127.0.0.1:1"}), "router.lisen"),
        (_with(router={"listen": "127.0.0.1"}), "router.listen"),
        (_with(router={"listen": ":80"}), "router.listen"),
        (_with(router={"listen": "h:70000"}), "router.listen"),
        (_with(router={"listen": "h:-1"}), "router.listen"),
        (_with(router={"listen": "h:٨٠"}), "router.listen"),
        (_with(router={"listen": 8080}), "router.listen"),
        (_with(router={"unknown_policy": "yolo"}), "router.unknown_policy"),
        (_with(router={"max_connections": 0}), "router.max_connections"),
        (_with(router={"max_in_flight_per_connection": -1}), "router.max_in_flight_per_connection"),
        (_with(router={"max_sessions_per_connection": 1.5}), "router.max_sessions_per_connection"),
        (_with(router={"compression": "no"}), "router.compression"),
        (_with(router={"drain_seconds": -1}), "router.drain_seconds"),
        (_with(router="x"), "router"),
        (_with(probe={"timeout_ms": 0}), "probe.timeout_ms"),
        (_with(probe={"timeout_ms": "500"}), "probe.timeout_ms"),
        (_with(probe={"timeout_ms": True}), "probe.timeout_ms"),
        (_with(probe={"timeout_ms": 2.5}), "probe.timeout_ms"),
        (_with(probe={"timeout": 5}), "probe.timeout"),
        (_with(control={"heartbeat_seconds": 0}), "control.heartbeat_seconds"),
        (_with(control={"heartbeat_seconds": float("inf")}), "control.heartbeat_seconds"),
        (_with(control={"reconnect_max_ms": 0}), "control.reconnect_max_ms"),
        (_with(cache={"ttl_seconds": -1}), "cache.ttl_seconds"),
        (_with(cache={"max_entries": 0}), "cache.max_entries"),
        (_with(placement={"decay_seconds": 0}), "placement.decay_seconds"),
        (_with(placement={"half_life": 5}), "placement.half_life"),
        (_with(proxy={}), "proxy"),
        (_with(router={"tls_cert": "/c.pem"}), "router"),
        (_with(router={"tls_key": "/k.pem"}), "router"),
        (_with(router={"metrics_listen": "9100"}), "router.metrics_listen"),
        (_with(router={"allowed_origins": ["editor.example"]}), "router.allowed_origins"),
        (_with(router={"allowed_origins": ["https://e.example/path"]}), "router.allowed_origins"),
        (_with(router={"allowed_origins": "https://e.example"}), "router.allowed_origins"),
        (_with(router={"max_connections_per_address": 0}), "router.max_connections_per_address"),
        (
            _with(router={"new_sessions_per_minute_per_address": 0}),
            "router.new_sessions_per_minute_per_address",
        ),
        (_with(router={"new_sessions_per_minute": -5}), "router.new_sessions_per_minute"),
        (_backend(tls_ca="/ca.pem"), "backends.0"),
        (_backend(url="wss://h/acp", tls_cert="/c.pem"), "backends.0"),
        (_with(auth={}), "auth"),
        (_with(auth={"tokens": [""]}), "auth.tokens.0"),
        (_with(auth={"tokens": "abc"}), "auth.tokens"),
        (_with(auth={"tokens": ["t"], "bind_sessions": True}), "auth"),
        (_with(auth={"tokens": ["t"], "session_secret": "short"}), "auth.session_secret"),
        (
            _with(auth={"tokens": ["t"], "session_secret": "x" * 16, "session_secret_env": "S"}),
            "auth",
        ),
        (_with(auth={"tokens": ["t"], "token": "t"}), "auth.token"),
    ],
)
def test_bad_values_name_their_dotted_key(data: dict[str, Any], key: str) -> None:
    message = _error(data)
    assert message.startswith(f"config: {key}: "), message


def test_duplicate_backend_ids_name_the_backends_and_the_id() -> None:
    message = _error(
        {
            "backends": [
                {"id": "a", "url": "ws://h:1/acp"},
                {"id": "b", "url": "ws://h:2/acp"},
                {"id": "a", "url": "ws://h:3/acp"},
            ]
        }
    )
    assert message.startswith("config: backends: "), message
    assert "unique" in message
    assert "a" in message.removeprefix("config: backends: ")


def test_the_source_names_the_file() -> None:
    with pytest.raises(ConfigError, match=r"^my\.toml: backends: "):
        settings_from({}, source="my.toml")


# -- files -----------------------------------------------------------------------------------------


def test_load_settings(tmp_path: Path) -> None:
    path = tmp_path / "router.toml"
    path.write_text(
        '[router]\nlisten = "0.0.0.0:8080"\n\n'
        '[[backends]]\nid = "a"\nurl = "ws://a:1/acp"\nweight = 2\n\n'
        '[[backends]]\nid = "b"\nurl = "ws://b:1/acp"\n\n'
        "[probe]\ntimeout_ms = 300\n",
        encoding="utf-8",
    )
    settings = load_settings(path)
    assert settings.router.address == ("0.0.0.0", 8080)
    assert [b.id for b in settings.backends] == ["a", "b"]
    assert settings.probe.timeout_ms == 300
    assert load_settings(str(path)) == settings


def test_load_settings_names_the_file_and_key(tmp_path: Path) -> None:
    path = tmp_path / "router.toml"
    path.write_text('[[backends]]\nid = "a"\nurl = "http://a/acp"\n', encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value).startswith(f"{path}: backends.0.url: ")


def _load_error(path: Path) -> str:
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert "\n" not in message
    assert str(path) in message
    return message


def test_missing_file(tmp_path: Path) -> None:
    assert "cannot read config" in _load_error(tmp_path / "nope.toml")


def test_a_directory_is_not_a_config(tmp_path: Path) -> None:
    assert "cannot read config" in _load_error(tmp_path)


@pytest.mark.parametrize(
    "content",
    [
        b"[router\nlisten = 1\n",
        b'listen = "a"\nlisten = "b"\n',
        b"x = \n",
        b'[[backends]]\nid = "a"\nurl = """unterminated\n',
    ],
)
def test_invalid_toml(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    assert "not valid TOML" in _load_error(path)


def test_a_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "latin1.toml"
    path.write_bytes('[[backends]]\nid = "café"\nurl = "ws://h/acp"\n'.encode("latin-1"))
    assert "not valid TOML" in _load_error(path)
