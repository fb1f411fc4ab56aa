"""Validating JSON-RPC frames against the official ACP JSON Schema (draft 2020-12) that
the TypeScript SDK package ships (``tests/interop``, installed by ``make interop``).

The schema's root accepts almost anything (its params unions include open extension
objects), so each message is checked against the definition its method names, the way
the schema itself links them (``x-method``): ``<X>Request`` for a request's params,
``<X>Response`` for a result (the request's method is looked up by id),
``<X>Notification`` for a notification's params, and ``Error`` for an error object.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from jsonschema import Draft202012Validator

from tests.hosted import TS_SDK

SCHEMA_V1 = TS_SDK / "schema" / "v1" / "schema.unstable.json"

JsonObject = dict[str, Any]


class AcpSchema:
    def __init__(self, path: Path = SCHEMA_V1) -> None:
        schema = json.loads(path.read_text())
        self._defs: dict[str, Any] = schema["$defs"]
        #: (method, "Request" | "Response" | "Notification") -> definition name
        self._by_method: dict[tuple[str, str], str] = {}
        for name, definition in self._defs.items():
            method = definition.get("x-method")
            kind = next(
                (k for k in ("Request", "Response", "Notification") if name.endswith(k)), None
            )
            if isinstance(method, str) and kind is not None and definition.get("x-side") != "proxy":
                self._by_method.setdefault((method, kind), name)
        self._validators: dict[str, Draft202012Validator] = {}

    def problems(self, definition: str, value: Any) -> list[str]:
        validator = self._validators.get(definition)
        if validator is None:
            validator = Draft202012Validator({"$ref": f"#/$defs/{definition}", "$defs": self._defs})
            self._validators[definition] = validator
        return [f"{definition}: {error.message}" for error in validator.iter_errors(value)]

    def definition(self, method: str, kind: str) -> str | None:
        return self._by_method.get((method, kind))

    def check_frames(self, frames: Iterable[JsonObject], methods: dict[Any, str]) -> list[str]:
        """Problems in ``frames``; ``methods`` maps request ids to the method asked
        (requests in ``frames`` are added to it as they go by)."""
        found: list[str] = []
        for frame in frames:
            found += self.check_envelope(frame)
            method = frame.get("method")
            if isinstance(method, str):
                kind = "Request" if "id" in frame else "Notification"
                if kind == "Request":
                    methods[frame["id"]] = method
                name = self.definition(method, kind)
                if name is not None:
                    found += self.problems(name, frame.get("params"))
            elif "error" in frame:
                found += self.problems("Error", frame["error"])
            else:
                asked = methods.get(frame.get("id"))
                name = self.definition(asked, "Response") if asked else None
                if name is not None:
                    found += self.problems(name, frame["result"])
        return found

    def check_envelope(self, frame: JsonObject) -> list[str]:
        if frame.get("jsonrpc") != "2.0":
            return [f"not JSON-RPC 2.0: {frame}"]
        if "id" in frame:
            return self.problems("RequestId", frame["id"])
        return []
