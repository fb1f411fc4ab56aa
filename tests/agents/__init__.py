"""Stdio ACP agents written with the official SDKs, run behind ``acp-router host`` by tests."""
