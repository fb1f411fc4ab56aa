"""Tests that start processes: the CLI, fleets of agents, the host, deploy tools, a browser."""
