"""A DNS server the test controls: real UDP on 127.0.0.1 port 0, answering A and PTR
queries from tables the test changes while the router runs (dnspython builds the
messages; the router's resolver is dnspython too, but speaks to this over a socket)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import cast

import dns.exception
import dns.message
import dns.name
import dns.rcode
import dns.rdatatype
import dns.reversename
import dns.rrset


class DnsServer(asyncio.DatagramProtocol):
    def __init__(self) -> None:
        #: name -> its A records
        self.addresses: dict[str, list[str]] = {}
        #: address -> its PTR name
        self.names: dict[str, str] = {}
        #: drop every query (a DNS outage: the lookups time out)
        self.silent = False
        self.port = 0
        self._transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # the selector loop's datagram transport is not a DatagramTransport subclass
        self._transport = cast(asyncio.DatagramTransport, transport)

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        if self.silent or self._transport is None:
            return
        query = dns.message.from_wire(data)
        response = dns.message.make_response(query)
        (question,) = query.question
        records = self._answer(question.name, question.rdtype)
        if records:
            rdtype = dns.rdatatype.to_text(question.rdtype)
            response.answer.append(
                dns.rrset.from_text_list(question.name, 0, "IN", rdtype, records)
            )
        else:
            response.set_rcode(dns.rcode.NXDOMAIN)
        self._transport.sendto(response.to_wire(), addr)

    def _answer(self, name: dns.name.Name, rdtype: int) -> list[str]:
        if rdtype == dns.rdatatype.A:
            return list(self.addresses.get(name.to_text(omit_final_dot=True).lower(), []))
        if rdtype == dns.rdatatype.PTR:
            try:
                address = dns.reversename.to_address(name)
            except dns.exception.SyntaxError:
                return []
            return [f"{self.names[address]}."] if address in self.names else []
        return []


@asynccontextmanager
async def dns_server() -> AsyncIterator[DnsServer]:
    loop = asyncio.get_running_loop()
    transport, server = await loop.create_datagram_endpoint(DnsServer, local_addr=("127.0.0.1", 0))
    server.port = transport.get_extra_info("sockname")[1]
    try:
        yield server
    finally:
        transport.close()
