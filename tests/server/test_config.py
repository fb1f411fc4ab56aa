"""router.server.config: TOML settings, validated, with one error line naming the bad key."""

from __future__ import annotations

import dataclasses
import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, get_args

import pytest
from pydantic import BaseModel

from router.core.calls import Limits
from router.core.directory import Bounds
from router.core.locate import UnknownPolicy
from router.protocol.errors import ConfigError
from router.server.config import Settings, load_settings, settings_from
from router.server.connection.client import limits_of
from router.server.pool.backends import bounds_of

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


@pytest.mark.parametrize(
    ("from_config", "core_default"),
    [(limits_of, Limits), (bounds_of, Bounds)],
    ids=["Limits", "Bounds"],
)
def test_the_cores_defaults_are_the_configs(
    from_config: Callable[[Settings], Any], core_default: type[Any]
) -> None:
    """A core built with its defaults (as the core's tests build it) is the router a
    config file without those keys deploys, field by field."""
    configured, default = from_config(settings_from(MINIMAL)), core_default()
    for field in dataclasses.fields(core_default):
        assert getattr(configured, field.name) == getattr(default, field.name), field.name


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


@pytest.mark.parametrize(
    ("grace", "most", "accepted"), [(600, 200, True), (599, 200, False), (0, 1, False)]
)
def test_the_grace_spans_three_reconnect_intervals(grace: int, most: int, accepted: bool) -> None:
    data = _with(control={"down_grace_ms": grace, "reconnect_max_ms": most})
    if accepted:
        assert settings_from(data).control.down_grace_ms == grace
    else:
        message = _error(data)
        assert "'down_grace_ms'" in message, message
        assert "'reconnect_max_ms'" in message, message


@pytest.mark.parametrize(
    ("grace", "most"), [(3000, 1000), (600, 200), (30_000, 5000), (90_000, 5000)]
)
def test_a_grace_alone_is_enough_the_cap_follows_it(grace: int, most: int) -> None:
    # a grace shorter than three default caps (15 s) was refused for a key nobody set
    control = settings_from(_with(control={"down_grace_ms": grace})).control
    assert (control.down_grace_ms, control.reconnect_max_ms) == (grace, most)
    assert settings_from(MINIMAL).control.reconnect_max_ms == 5000


def test_a_grace_alone_starts_and_a_contradiction_names_both_keys(tmp_path: Path) -> None:
    path = tmp_path / "router.toml"
    backend = '[[backends]]\nid = "a"\nurl = "ws://a:1/acp"\n\n'
    path.write_text(f"{backend}[control]\ndown_grace_ms = 3000\n", encoding="utf-8")
    assert load_settings(path).control.down_grace_ms == 3000
    path.write_text(
        f"{backend}[control]\ndown_grace_ms = 4000\nreconnect_max_ms = 5000\n", encoding="utf-8"
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: control: 'down_grace_ms' (4000) must be at least"), message
    assert "'reconnect_max_ms' (5000)" in message, message


def test_every_problem_is_named_in_one_line() -> None:
    data = {
        "backends": [
            {"id": "a", "ulr": "ws://h/acp"},
            {"id": "b", "url": "ws://h/acp", "weight": 0},
        ],
        "probe": {"timeout_ms": "500"},
        "routr": {"listen": "0.0.0.0:1"},
    }
    assert _error(data) == (
        "config: 4 problems:"
        f" {B1}: unknown key 'ulr' (did you mean 'url'?);"
        f" {B2}: 'weight' must be greater than 0, not 0;"
        " probe: 'timeout_ms' must be an integer, not the string \"500\";"
        " unknown table [routr] (did you mean [router]?)"
    )


def test_settings_are_frozen() -> None:
    settings = settings_from(MINIMAL)
    with pytest.raises(ValueError, match="frozen"):
        settings.probe.timeout_ms = 1  # type: ignore[misc]


B1 = "backends (the 1st [[backends]] table)"
B2 = "backends (the 2nd [[backends]] table)"
#: pydantic's own words, which an operator should never have to read
JARGON = ("Input should", "Extra inputs", "Field required", "Value error", "instance of", "dict")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # an unknown key, with the nearest known one
        (_backend(wieght=2), f"{B1}: unknown key 'wieght' (did you mean 'weight'?)"),
        (
            {
                "backends": [
                    {"id": "a", "url": "ws://h/acp"},
                    {"id": "b", "url": "ws://h/acp", "wieght": 2},
                ]
            },
            f"{B2}: unknown key 'wieght' (did you mean 'weight'?)",
        ),
        (
            _with(router={"lisen": "127.0.0.1:1"}),
            "router: unknown key 'lisen' (did you mean 'listen'?)",
        ),
        (_with(probe={"timeout": 5}), "probe: unknown key 'timeout' (did you mean 'timeout_ms'?)"),
        (
            _with(auth={"tokens": ["t"], "tokenz": "t"}),
            "auth: unknown key 'tokenz' (did you mean 'tokens'?)",
        ),
        (_with(cache={"size": 5}), "cache: unknown key 'size'"),
        (_with(proxy={}), "unknown table [proxy] (did you mean [probe]?)"),
        (_with(routr={}), "unknown table [routr] (did you mean [router]?)"),
        (_with(listen="0.0.0.0:1"), "unknown key 'listen' at the top level (it goes in [router])"),
        (
            _with(tokens=["t"]),
            "unknown key 'tokens' at the top level (it goes in [auth] or [admin])",
        ),
        # a missing key
        ({"backends": [{"url": "ws://h/acp"}]}, f"{B1}: missing key 'id'"),
        ({"backends": [{"id": "a"}]}, f"{B1}: missing key 'url'"),
        (
            {"discovery": [{"dns": "agents.local"}]},
            "discovery (the 1st [[discovery]] table): missing key 'port'",
        ),
        # a value of the wrong type
        (_backend(weight="2"), f"{B1}: 'weight' must be a number, not the string \"2\""),
        (_backend(weight=True), f"{B1}: 'weight' must be a number, not true"),
        (_backend(id=3), f"{B1}: 'id' must be a string, not 3"),
        (_with(probe={"timeout_ms": 2.5}), "probe: 'timeout_ms' must be an integer, not 2.5"),
        (
            _with(router={"compression": "no"}),
            "router: 'compression' must be true or false, not the string \"no\"",
        ),
        (
            _with(router={"allowed_origins": "https://e.example"}),
            "router: 'allowed_origins' must be an array, not the string \"https://e.example\"",
        ),
        (
            _with(router={"allowed_origins": [1]}),
            "router: the 1st item of 'allowed_origins' must be a string, not 1",
        ),
        (_with(router="x"), "'router' must be a table, not the string \"x\""),
        (
            _with(probe={"status_aliases": ["warm"]}),
            "probe: 'status_aliases' must be a table, not an array",
        ),
        (
            {"backends": "ws://h/acp"},
            "'backends' must be [[backends]] tables, not the string \"ws://h/acp\"",
        ),
        (
            {"backends": ["ws://h/acp"]},
            "the 1st item of 'backends' must be a table, not the string \"ws://h/acp\"",
        ),
        # a number out of range
        (_backend(weight=0), f"{B1}: 'weight' must be greater than 0, not 0"),
        (_backend(weight=float("inf")), f"{B1}: 'weight' must be a finite number, not inf"),
        (_with(router={"drain_seconds": -1}), "router: 'drain_seconds' must be at least 0, not -1"),
        (
            {"discovery": [{"dns": "agents.local", "port": 70000}]},
            "discovery (the 1st [[discovery]] table): 'port' must be at most 65535, not 70000",
        ),
        # a word that is not one of the choices
        (
            _with(router={"unknown_policy": "yolo"}),
            'router: \'unknown_policy\' must be "fail_closed" or "place_anyway", not the string "yolo"',
        ),
        (
            _with(probe={"status_aliases": {"warm": "hot"}}),
            'probe.status_aliases: \'warm\' must be "active", "inactive" or "not_found", not the string "hot"',
        ),
        # too short (secrets are never repeated back)
        (_backend(id=""), f"{B1}: 'id' must not be empty"),
        (_with(auth={"tokens": [""]}), "auth: the 1st item of 'tokens' must not be empty"),
        (_with(auth={"tokens": "abc"}), "auth: 'tokens' must be an array"),
        (
            _with(auth={"tokens": ["t"], "session_secret": "short"}),
            "auth: 'session_secret' must be at least 16 characters long (it has 5)",
        ),
        # the router's own checks
        (
            _backend(url="http://h/acp"),
            f"{B1}: 'url' must be a ws:// or wss:// URL (such as ws://agent-1:9001/acp), not the string \"http://h/acp\"",
        ),
        (
            _backend(tls_ca="/ca.pem"),
            f"{B1}: 'tls_ca', 'tls_cert' and 'tls_key' are for a wss:// 'url', not the string \"ws://h:1/acp\"",
        ),
        (
            _backend(url="wss://h/acp", tls_cert="/c.pem"),
            f"{B1}: 'tls_cert' needs 'tls_key' too: a certificate goes with its key",
        ),
        (
            _with(router={"tls_key": "/k.pem"}),
            "router: 'tls_key' needs 'tls_cert' too: a certificate goes with its key",
        ),
        (
            _with(router={"listen": "127.0.0.1"}),
            "router: 'listen' must be HOST:PORT (such as 127.0.0.1:8765), not the string \"127.0.0.1\"",
        ),
        (
            _with(router={"metrics_listen": "9100"}),
            "router: 'metrics_listen' must be HOST:PORT (such as 127.0.0.1:8765), not the string \"9100\"",
        ),
        (
            _with(router={"allowed_origins": ["*", "editor.example"]}),
            'router: the 2nd item of \'allowed_origins\' must be an origin (scheme://host[:port], such as https://editor.example) or "*", not the string "editor.example"',
        ),
        (
            {"discovery": [{"dns": "agents.local", "port": 9001, "path": "acp"}]},
            "discovery (the 1st [[discovery]] table): 'path' must start with / (such as /acp), not the string \"acp\"",
        ),
        (
            {"discovery": [{"dns": "agents.local", "port": 9001, "nameserver": "ns"}]},
            "discovery (the 1st [[discovery]] table): 'nameserver' must be HOST:PORT (such as 127.0.0.1:8765), not the string \"ns\"",
        ),
        (_with(auth={}), "auth: give at least one of 'tokens', 'tokens_file' and 'token_env'"),
        (_with(admin={}), "admin: give at least one of 'tokens', 'tokens_file' and 'token_env'"),
        (
            _with(auth={"tokens": ["t"], "bind_sessions": True}),
            "auth: 'bind_sessions' needs 'session_secret', 'session_secret_file' or 'session_secret_env'",
        ),
        (
            _with(auth={"tokens": ["t"], "session_secret": "x" * 16, "session_secret_env": "S"}),
            "auth: give only one of 'session_secret', 'session_secret_file' and 'session_secret_env'",
        ),
        ({}, "give at least one [[backends]] table (or a [[discovery]] table)"),
        (
            _with(control={"down_grace_ms": 4000, "reconnect_max_ms": 5000}),
            "control: 'down_grace_ms' (4000) must be at least 3 x 'reconnect_max_ms' (5000),"
            " 15000: a backend is given up only once its link has tried it throughout the"
            " grace, and a shorter one gives up a backend that is merely restarting"
            " (without 'reconnect_max_ms', the cap follows the grace)",
        ),
        (
            _with(control={"reconnect_max_ms": 20_000}),
            "control: 'down_grace_ms' (30000, its default) must be at least 3 x"
            " 'reconnect_max_ms' (20000), 60000: a backend is given up only once its link has"
            " tried it throughout the grace, and a shorter one gives up a backend that is"
            " merely restarting",
        ),
        (
            _with(control={"down_grace_ms": 2}),
            "control: 'down_grace_ms' (2) must be at least 3: a backend is given up only once"
            " its link has tried it throughout the grace, and a shorter one gives up a backend"
            " that is merely restarting",
        ),
        # a misspelled key or table: the near miss is named, not the key it lacks
        (
            {"backends": [{"id": "a", "ulr": "ws://h/acp"}]},
            f"{B1}: unknown key 'ulr' (did you mean 'url'?)",
        ),
        (
            {"backend": [{"id": "a", "url": "ws://h/acp"}]},
            "unknown table [[backend]] (did you mean [[backends]]?)",
        ),
        (_with(backend={"id": "a"}), "unknown table [backend] (did you mean [[backends]]?)"),
        (
            {"backends": [{"id": "a", "url": "ws://h:1/acp"}, {"id": "a", "url": "ws://h:2/acp"}]},
            "each [[backends]] table needs a unique 'id'; repeated: \"a\"",
        ),
    ],
)
def test_each_kind_of_mistake_reads_in_plain_words(data: dict[str, Any], message: str) -> None:
    assert _error(data) == f"config: {message}"


@pytest.mark.parametrize(
    ("data", "where", "key"),
    [
        (_backend(url="ws:///acp"), B1, "url"),
        (_backend(url="not a url"), B1, "url"),
        (_backend(url="ws://h:99999/acp"), B1, "url"),
        (_backend(url="ws://h:port/acp"), B1, "url"),
        (_backend(url=5), B1, "url"),
        (_backend(weight=-1.5), B1, "weight"),
        (_backend(weight=float("nan")), B1, "weight"),
        (
            {"backends": [{"id": "a", "url": "ws://h/acp"}, {"id": "b", "url": "ftp://h"}]},
            B2,
            "url",
        ),
        ({"backends": []}, "", "[[backends]]"),
        (_with(router={"listen": ":80"}), "router", "listen"),
        (_with(router={"listen": "h:70000"}), "router", "listen"),
        (_with(router={"listen": "h:-1"}), "router", "listen"),
        (_with(router={"listen": "h:٨٠"}), "router", "listen"),
        (_with(router={"listen": 8080}), "router", "listen"),
        (_with(router={"max_connections": 0}), "router", "max_connections"),
        (
            _with(router={"max_in_flight_per_connection": -1}),
            "router",
            "max_in_flight_per_connection",
        ),
        (
            _with(router={"max_sessions_per_connection": 1.5}),
            "router",
            "max_sessions_per_connection",
        ),
        (_with(router={"tls_cert": "/c.pem"}), "router", "tls_cert"),
        (
            _with(router={"allowed_origins": ["https://e.example/path"]}),
            "router",
            "allowed_origins",
        ),
        (_with(router={"max_connections_per_address": 0}), "router", "max_connections_per_address"),
        (
            _with(router={"new_sessions_per_minute_per_address": 0}),
            "router",
            "new_sessions_per_minute_per_address",
        ),
        (_with(router={"new_sessions_per_minute": -5}), "router", "new_sessions_per_minute"),
        (_with(probe={"timeout_ms": 0}), "probe", "timeout_ms"),
        (_with(probe={"timeout_ms": "500"}), "probe", "timeout_ms"),
        (_with(probe={"timeout_ms": True}), "probe", "timeout_ms"),
        (_with(control={"heartbeat_seconds": 0}), "control", "heartbeat_seconds"),
        (_with(control={"heartbeat_seconds": float("inf")}), "control", "heartbeat_seconds"),
        (_with(control={"reconnect_max_ms": 0}), "control", "reconnect_max_ms"),
        (_with(control={"down_grace_ms": -1}), "control", "down_grace_ms"),
        (_with(cache={"ttl_seconds": -1}), "cache", "ttl_seconds"),
        (_with(cache={"max_entries": 0}), "cache", "max_entries"),
        (_with(placement={"decay_seconds": 0}), "placement", "decay_seconds"),
        (_with(placement={"half_life": 5}), "placement", "half_life"),
        (_with(auth={"tokens": ["t"], "session_secret_env": ""}), "auth", "session_secret_env"),
        (_with(admin={"tokens": ["t"], "token_env": 5}), "admin", "token_env"),
    ],
)
def test_bad_values_name_their_table_and_key(data: dict[str, Any], where: str, key: str) -> None:
    message = _error(data).removeprefix("config: ")
    if where:
        assert message.startswith(f"{where}: "), message
    quoted = key if key.startswith("[") else f"'{key}'"
    assert quoted in message, message
    assert not [word for word in JARGON if word in message], message


def test_secrets_are_not_repeated_in_errors() -> None:
    secret = "s3cr3t-but-short"[:12]
    message = _error(_with(auth={"tokens": ["t"], "session_secret": secret}))
    assert secret not in message
    message = _error(_with(auth={"tokens": secret}))
    assert secret not in message


def test_the_source_names_the_file() -> None:
    with pytest.raises(ConfigError, match=r"^my\.toml: give at least one \[\[backends\]\] "):
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
    path.write_text(
        '[[backends]]\nid = "a"\nurl = "ws://a/acp"\n\n'
        '[[backends]]\nid = "b"\nurl = "ws://b/acp"\nwieght = 2\n',
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    assert str(caught.value) == (
        f"{path}: backends (the 2nd [[backends]] table): unknown key 'wieght'"
        " (did you mean 'weight'?)"
    )


@pytest.mark.parametrize(
    ("number", "words"),
    [(1, "1st"), (2, "2nd"), (3, "3rd"), (4, "4th"), (11, "11th"), (12, "12th"), (13, "13th"),
     (21, "21st"), (22, "22nd"), (101, "101st"), (111, "111th")],
)  # fmt: skip
def test_tables_are_counted_from_one(number: int, words: str) -> None:
    backends = [{"id": f"b{n}", "url": "ws://h/acp"} for n in range(number)]
    backends[-1]["url"] = "http://h/acp"
    message = _error({"backends": backends})
    assert message.startswith(f"config: backends (the {words} [[backends]] table): 'url' "), message


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


def test_the_event_loop_is_asyncio_or_uvloop() -> None:
    assert settings_from(_with()).router.event_loop == "uvloop"  # installed with the package
    assert settings_from(_with(router={"event_loop": "asyncio"})).router.event_loop == "asyncio"
    assert _error(_with(router={"event_loop": "trio"})) == (
        'config: router: \'event_loop\' must be "asyncio" or "uvloop", not the string "trio"'
    )


def test_uvloop_not_installed_is_a_config_error_naming_the_key(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as if it were not installed
    message = _error(_with(router={"event_loop": "uvloop"}))
    assert message.startswith("config: router: 'event_loop' is \"uvloop\", but uvloop is not")
    assert "pip install 'acp-router[uvloop]'" in message
    assert settings_from(_with(router={})).router.event_loop == "asyncio"  # the default without it


def test_tracing_and_the_request_log() -> None:
    router = settings_from(MINIMAL).router
    assert (router.tracing, router.request_log, router.request_log_fraction) == (
        "continue",
        "off",
        0.0,
    )
    for given, fraction in [("on", 1.0), ("off", 0.0), (0.25, 0.25), (1, 1.0)]:
        router = settings_from(_with(router={"request_log": given})).router
        assert router.request_log_fraction == fraction
    assert settings_from(_with(router={"tracing": "always"})).router.tracing == "always"


@pytest.mark.parametrize("value", [0, 0.0, 1.5, -0.1, "sometimes", True, "ON"])
def test_the_request_log_is_on_off_or_a_fraction(value: Any) -> None:
    message = _error(_with(router={"request_log": value}))
    assert message.startswith('config: router: \'request_log\' must be "on", "off" or the fraction')


@pytest.mark.parametrize("value", ["on", "sometimes", 1, True])
def test_tracing_is_off_continue_or_always(value: Any) -> None:
    message = _error(_with(router={"tracing": value}))
    assert 'router: \'tracing\' must be "off", "continue" or "always"' in message


def _sections() -> list[tuple[str, type[BaseModel]]]:
    """Every table of the configuration: its name and its model."""
    found = []
    for name, field in Settings.model_fields.items():
        for model in (field.annotation, *get_args(field.annotation)):
            for inner in (model, *get_args(model)):
                if isinstance(inner, type) and issubclass(inner, BaseModel):
                    found.append((name, inner))
    return found


EXAMPLE = Path(__file__).resolve().parents[2] / "config" / "router.example.toml"


@pytest.mark.parametrize(("table", "model"), _sections(), ids=lambda v: getattr(v, "__name__", v))
def test_the_example_configuration_lists_every_key(table: str, model: type[BaseModel]) -> None:
    """config/router.example.toml says it lists every key (set, or commented out)."""
    text = EXAMPLE.read_text()
    missing = [
        key
        for key in model.model_fields
        if not re.search(
            rf"^#?\s*({re.escape(key)}\s*=|\[{re.escape(table)}\.{re.escape(key)}\])",
            text,
            re.MULTILINE,
        )
    ]
    assert not missing, f"[{table}] keys missing from {EXAMPLE.name}: {missing}"
