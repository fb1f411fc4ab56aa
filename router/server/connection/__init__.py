"""One client connection: the I/O shell around its routing core, its links to backends, its gate, the requests it observes, its WebSocket channel."""
