"""The protocol layer, sans-I/O: the JSON-RPC envelope (:mod:`.jsonrpc`), the ACP facts the
router routes on (:mod:`.acp`), the one exception tree carrying JSON-RPC codes
(:mod:`.errors`) and the typed identifiers (:mod:`.ids`).

Shared by the router and the reference agent. Nothing here does I/O or reads a clock.
"""
