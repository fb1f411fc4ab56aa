"""The front door end to end: TLS both ways (reference agents behind wss), /metrics on its
own address, and the demo with a token (tests/server/test_frontdoor.py: bearer tokens,
Origin and connections per address)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import ssl
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import trustme
from websockets.asyncio.client import connect

from tests.fleet import inactive, start_router, start_scripted
from tests.server.support import TOKEN, bearer
from tests.support import CWD, WAIT, AcpClient, run_cli, run_cli_to_exit, start_agent, text_chunks

# -- TLS -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Pki:
    ca: trustme.CA
    issued: trustme.LeafCert
    cert: Path
    key: Path
    ca_file: Path

    def client_context(self) -> ssl.SSLContext:
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    """A CA and a certificate for 127.0.0.1 and localhost, made for this test."""
    ca = trustme.CA()
    issued = ca.issue_cert("127.0.0.1", "localhost")
    cert, key, ca_file = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    issued.cert_chain_pems[0].write_to_path(str(cert))
    issued.private_key_pem.write_to_path(str(key))
    ca.cert_pem.write_to_path(str(ca_file))
    return Pki(ca, issued, cert, key, ca_file)


async def test_a_tls_front_door_before_a_wss_backend(tmp_path: Path, pki: Pki) -> None:
    tls = {"tls_cert": str(pki.cert), "tls_key": str(pki.key)}
    async with start_agent(
        tmp_path, "agent-tls", "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)
    ) as agent:
        assert agent.url.startswith("wss://127.0.0.1:"), agent.url
        backend = {"id": agent.agent_id, "url": agent.url, "tls_ca": str(pki.ca_file)}
        async with start_router([backend], router=tls, auth={"tokens": [TOKEN]}) as router:
            assert router.url.startswith("wss://"), router.url
            with pytest.raises(ssl.SSLCertVerificationError):
                async with connect(router.url, additional_headers=bearer(TOKEN)):
                    pass  # a client that does not trust the test CA stops at the handshake
            tls_client = pki.client_context()
            async with AcpClient.connect(router.url, token=TOKEN, tls=tls_client) as client:
                await client.initialize()
                session_id = await client.new_session(CWD)
                client.drain_incoming()
                response = await client.prompt(session_id, "over tls")
                assert response["result"] == {"stopReason": "end_turn"}
                assert ("agent_message_chunk", "[agent-tls] over tls") in text_chunks(
                    client.drain_incoming()
                )


class LogWatch(logging.Handler):
    """Sets :attr:`seen` when a record containing ``substring`` is logged."""

    def __init__(self, substring: str) -> None:
        super().__init__()
        self.substring = substring
        self.seen = asyncio.Event()
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if self.substring in message:
            self.messages.append(message)
            self.seen.set()

    @classmethod
    @contextlib.contextmanager
    def on(cls, logger: str, substring: str) -> Iterator[LogWatch]:
        watch = cls(substring)
        target = logging.getLogger(logger)
        level = target.level
        target.addHandler(watch)
        target.setLevel(logging.INFO)
        try:
            yield watch
        finally:
            target.removeHandler(watch)
            target.setLevel(level)

    async def wait(self) -> str:
        async with asyncio.timeout(WAIT):
            await self.seen.wait()
        return self.messages[0]


async def test_a_wss_backend_the_router_does_not_trust_stays_down(tmp_path: Path, pki: Pki) -> None:
    other_ca = tmp_path / "other-ca.pem"
    trustme.CA().cert_pem.write_to_path(str(other_ca))
    async with start_agent(
        tmp_path, "agent-tls", "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)
    ) as agent:
        backend = {"id": agent.agent_id, "url": agent.url, "tls_ca": str(other_ca)}
        with LogWatch.on("router.server.links.control", "control link failed") as failed:
            async with start_router([backend], wait_for=0) as router:
                assert "CERTIFICATE_VERIFY_FAILED" in await failed.wait()
                assert router.pool.ready() == []
                async with AcpClient.connect(router.url) as client:
                    await client.initialize()
                    new = await client.request("session/new", {"cwd": CWD, "mcpServers": []})
                    assert new["error"]["code"] == -32011  # no backend is up


async def test_a_wss_backend_that_asks_for_a_client_certificate(tmp_path: Path, pki: Pki) -> None:
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    pki.issued.configure_cert(server)
    pki.ca.configure_trust(server)
    server.verify_mode = ssl.CERT_REQUIRED  # mutual TLS: no client certificate, no link
    router_cert = pki.ca.issue_cert("acp-router.internal")
    cert, key = tmp_path / "router-cert.pem", tmp_path / "router-key.pem"
    router_cert.cert_chain_pems[0].write_to_path(str(cert))
    router_cert.private_key_pem.write_to_path(str(key))
    async with start_scripted("a", inactive, tls=server) as backend:
        assert backend.url.startswith("wss://")
        with_cert = {
            "id": "a",
            "url": backend.url,
            "tls_ca": str(pki.ca_file),
            "tls_cert": str(cert),
            "tls_key": str(key),
        }
        async with start_router([with_cert]) as router, AcpClient.connect(router.url) as client:
            await client.initialize()
            new = await client.request("session/new", {"cwd": CWD, "mcpServers": []})
            assert "result" in new, new  # the client's own link presented the certificate too
        assert [m["method"] for m in backend.received if "method" in m].count("session/new") == 1
        without = {"id": "a", "url": backend.url, "tls_ca": str(pki.ca_file)}
        with LogWatch.on("router.server.links.control", "control link failed") as failed:
            async with start_router([without], wait_for=0) as router:
                await failed.wait()
                assert router.pool.ready() == []


# -- /metrics on its own address -------------------------------------------------------------------


async def test_metrics_on_a_separate_listen_address(tmp_path: Path) -> None:
    async with start_agent(tmp_path, "agent-1") as agent:
        config = tmp_path / "router.toml"
        config.write_text(
            '[router]\nlisten = "127.0.0.1:0"\nmetrics_listen = "127.0.0.1:0"\n\n'
            f'[[backends]]\nid = "agent-1"\nurl = "{agent.url}"\n',
            encoding="utf-8",
        )
        async with run_cli("serve", "--config", str(config)) as serve:
            front = serve.first_line.removeprefix("acp-router listening on ")
            open_door = "WARNING router.server.process.serving: no [auth] section"
            await serve.wait_for_log(open_door)
            line = await serve.wait_for_log("metrics on http://")
            match = re.search(r"metrics on (http://\S+)", line)
            assert match is not None, line
            async with aiohttp.ClientSession() as http:
                async with http.get(match.group(1)) as response:
                    assert response.status == 200
                    assert "acp_router_auth_total" in await response.text()
                base = front.replace("ws://", "http://").removesuffix("/acp")
                async with http.get(f"{base}/metrics") as response:
                    assert response.status == 404
                async with http.get(f"{base}/healthz") as response:
                    assert response.status == 200
            assert serve.stderr.text.count(open_door) == 1, serve.stderr.text


# -- the client side: connect, status and the demo ------------------------------------------------


async def test_the_demo_with_a_token_prints_how_to_connect(monkeypatch: pytest.MonkeyPatch) -> None:
    async with run_cli("demo", "--port", "0", "--agents", "1", "--token", TOKEN) as demo:
        front = demo.first_line.rpartition(" behind ")[2]
        line = await demo.stdout.wait_for("Try it:")
        assert f"ACP_ROUTER_TOKEN='{TOKEN}' " in line, line
        assert line.rstrip().endswith(f"-m router connect {front}"), line
        await demo.wait_for_log("backend agent-1 is up")
        initialize = (
            b'{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":1}}\n'
        )
        refused = await run_cli_to_exit("connect", front, stdin=initialize)
        assert refused.returncode != 0
        assert "401" in refused.stderr, refused.stderr
        monkeypatch.setenv("ACP_ROUTER_TOKEN", TOKEN)
        bridged = await run_cli_to_exit("connect", front, stdin=initialize)
        assert bridged.returncode == 0, bridged.stderr
        assert '"protocolVersion":1' in bridged.stdout.replace(" ", "")
        status = await run_cli_to_exit("status", front, "sess_nobody")
        assert (status.returncode, status.stdout.strip()) == (4, "sess_nobody: unknown")
