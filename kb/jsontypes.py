"""Names for JSON documents as they cross a boundary (the wire, a file, a row's JSON column).

A request body replayed to llama-server, a reply as the server sent it, or a capture file's
record is JSON whose keys are open-ended (OpenAI clients add fields the project has never
seen, and every one of them must survive a replay unchanged). Those values are typed as
`JsonObject`; everything the project derives from them is a typed record.
"""

from __future__ import annotations

from typing import Any, TypeAlias

__all__ = ["JsonObject", "JsonValue"]

JsonObject: TypeAlias = dict[str, Any]
"""A JSON object exactly as read or written: a request body, a reply, a file's record."""

JsonValue: TypeAlias = Any
"""Any JSON value (object, array, string, number, true/false, null)."""
