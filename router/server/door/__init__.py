"""The front door: every TCP connection from accept to its first request, the door's checks, the WebSocket upgrade and the Streamable HTTP transport, and the application's state."""
