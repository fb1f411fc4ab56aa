"""Reading ACP request params into values; anything malformed raises ``InvalidParams``.

Only what the reference agent uses is checked; unknown fields (``_meta``,
``additionalDirectories``, ...) are accepted and ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import PurePosixPath, PureWindowsPath
from typing import Any

from router.protocol.errors import InvalidParams
from router.protocol.jsonrpc import Params


@dataclass(frozen=True, slots=True)
class Prompt:
    """The text blocks of a ``session/prompt``, in order; other block types are skipped."""

    texts: tuple[str, ...]

    @property
    def command(self) -> str:
        """The first text block, stripped: where ``/slow`` and ``/permission`` are read."""
        return self.texts[0].strip() if self.texts else ""


def as_object(params: Params) -> dict[str, Any]:
    """The params object (absent params count as ``{}``)."""
    if params is None:
        return {}
    if not isinstance(params, dict):
        raise InvalidParams("params must be an object")
    return params


def session_id(params: dict[str, Any]) -> str:
    return required_str(params, "sessionId")


def required_str(params: dict[str, Any], name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str):
        raise InvalidParams(f"{name} is required and must be a string")
    return value


def optional_str(params: dict[str, Any], name: str) -> str | None:
    value = params.get(name)
    if value is not None and not isinstance(value, str):
        raise InvalidParams(f"{name} must be a string")
    return value


def cwd(params: dict[str, Any]) -> str:
    value = required_str(params, "cwd")
    if not (PurePosixPath(value).is_absolute() or PureWindowsPath(value).is_absolute()):
        raise InvalidParams(f"cwd must be an absolute path, got {value!r}")
    return value


def mcp_servers(params: dict[str, Any], *, required: bool) -> None:
    """Check ``mcpServers`` (a list; required by session/new and session/load)."""
    value = params.get("mcpServers")
    if value is None and not required:
        return
    if not isinstance(value, list):
        raise InvalidParams("mcpServers is required and must be a list")


def protocol_version(params: dict[str, Any]) -> int:
    value = params.get("protocolVersion")
    if type(value) is not int:
        raise InvalidParams("protocolVersion is required and must be an integer")
    return value


def prompt(params: dict[str, Any]) -> Prompt:
    blocks = params.get("prompt")
    if not isinstance(blocks, list):
        raise InvalidParams("prompt is required and must be a list of content blocks")
    return Prompt(tuple(text for text in map(_text_of, blocks) if text is not None))


def _text_of(block: Any) -> str | None:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise InvalidParams("each prompt content block must be an object with a string type")
    if block["type"] != "text":
        return None
    text = block.get("text")
    if not isinstance(text, str):
        raise InvalidParams("a text content block needs a string text")
    return text
