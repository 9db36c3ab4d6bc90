"""Which llama-server endpoint a request body is for, read from its OpenAI shape.

A chat completion has `messages`; an `/v1/embeddings` request has `input` (a string, a
token list, or a list of either) and no `messages`; a `/v1/rerank` request has `query` and
`documents` (Jina form) or `query` and `texts` (the TEI form b11434 also serves, answering a
bare list of `{index, score}`). The engine replays a captured request on the endpoint its
body belongs to, so an embeddings failure is replayed as an embeddings request (issue 24).
Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any

__all__ = [
    "CHAT_PATH",
    "EMBEDDINGS_PATH",
    "RERANK_PATH",
    "Endpoint",
    "body_problem",
    "endpoint_of",
    "input_texts",
    "rerank_documents_key",
]

CHAT_PATH = "/v1/chat/completions"
EMBEDDINGS_PATH = "/v1/embeddings"
RERANK_PATH = "/v1/rerank"
# Inputs of one request the engine looks at (tokenizes, splits); a capture is size-capped.
MAX_INPUTS = 256


class Endpoint(Enum):
    CHAT = CHAT_PATH
    EMBEDDINGS = EMBEDDINGS_PATH
    RERANK = RERANK_PATH

    @property
    def path(self) -> str:
        return str(self.value)


def rerank_documents_key(body: Mapping[str, Any]) -> str | None:
    """Where a rerank body lists its documents: `documents`, else `texts` (TEI form; b11434
    reads `documents` first), or None when neither is a list."""
    for key in ("documents", "texts"):
        if isinstance(body.get(key), list):
            return key
    return None


def endpoint_of(body: Mapping[str, Any]) -> Endpoint:
    """The endpoint a request body is for: rerank (`query` + `documents` or `texts`),
    embeddings (`input`, no `messages`), else a chat completion."""
    if "messages" in body:
        return Endpoint.CHAT
    if "query" in body and rerank_documents_key(body) is not None:
        return Endpoint.RERANK
    if "input" in body:
        return Endpoint.EMBEDDINGS
    return Endpoint.CHAT


def _is_tokens(value: Any) -> bool:
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(x, int) and not isinstance(x, bool) for x in value)
    )


def input_texts(body: Mapping[str, Any]) -> list[str | list[int]]:
    """The inputs an embeddings or rerank request asks the server to encode, in order: each
    string or token list of `input`; for rerank, each document (the query goes with each).
    At most MAX_INPUTS; other shapes are left out (body_problem names them)."""
    endpoint = endpoint_of(body)
    if endpoint is Endpoint.RERANK:
        docs = body.get(rerank_documents_key(body) or "documents")
        items: list[Any] = list(docs) if isinstance(docs, list) else []
    elif endpoint is Endpoint.EMBEDDINGS:
        value = body.get("input")
        items = [value] if isinstance(value, str) or _is_tokens(value) else list(value or [])
    else:
        return []
    out: list[str | list[int]] = []
    for item in items[:MAX_INPUTS]:
        if isinstance(item, str) or _is_tokens(item):
            out.append(item)
    return out


def body_problem(body: Mapping[str, Any]) -> str | None:
    """Why the engine cannot replay this body (a JSON path and what is wrong), or None."""
    endpoint = endpoint_of(body)
    if endpoint is Endpoint.CHAT:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            return (
                "$.messages is required (a non-empty list of chat messages); llama-server "
                "refuses a chat request without it (an embeddings request has `input`, a "
                "rerank request `query` and `documents`)"
            )
        return None
    if endpoint is Endpoint.RERANK:
        if not isinstance(body.get("query"), str):
            return "$.query must be a string (a /v1/rerank request)"
        key = rerank_documents_key(body) or "documents"
        docs = body.get(key) or []
        if not docs or not all(isinstance(d, str) for d in docs):
            return f"$.{key} must be a non-empty list of strings (a /v1/rerank request)"
        return None
    value = body.get("input")
    if isinstance(value, str) or _is_tokens(value):
        return None
    if isinstance(value, list) and value:
        if all(isinstance(x, str) or _is_tokens(x) for x in value):
            return None
    return (
        "$.input must be a string, a token list, or a non-empty list of strings / token "
        "lists (a /v1/embeddings request)"
    )
