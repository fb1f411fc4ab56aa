"""Links to backends: a client connection's link, the control link, probe rounds, the router's own WebSocket, TLS and the seam for third-party faults."""
