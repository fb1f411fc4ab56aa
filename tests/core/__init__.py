"""Sans-I/O tests: no sockets, no processes; seconds in all (``make test-fast``)."""
