"""Tests on real sockets in one process: the router and its peers on loopback, port 0."""
