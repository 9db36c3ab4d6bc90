"""What an incident is named after: the model, never the host.

A launched server's model is its GGUF file (the file name without `.gguf`; the GGUF's
`general.name` when the file name says nothing). A running server named by URL tells its
model in `/props` (`model_alias` when it is set to a name, else the file name of
`model_path`) or in `/v1/models` (the first model's `id`); a URL whose server tells none of
these gives "server" -- never the URL's host (issue 28: `http://127.0.0.1:8080` named an
incident "127.0.0").
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from triage.llama import client as llama_client
from triage.llama.client import LlamaClientError
from triage.llama.gguf_meta import read_gguf_meta

__all__ = ["ModelIdentity", "identity_from_file", "identity_from_server", "url_model_identity"]

UNKNOWN_MODEL = "server"
NAME_MAX = 200
PROBE_TIMEOUT = 10.0  # seconds for each of /props and /v1/models


@dataclass(frozen=True)
class ModelIdentity:
    """The model an incident is named after, and its weights file name (may be "")."""

    name: str
    weights: str = ""
    source: str = ""  # where the name came from: file | gguf | props | models | none


def _file_name(path: str) -> str:
    return os.path.basename(str(path).replace("\\", "/").rstrip("/"))


def _stem(name: str) -> str:
    return name[: -len(".gguf")] if name.lower().endswith(".gguf") else name


def identity_from_file(model: Path) -> ModelIdentity:
    """A launched server's model: the GGUF file name (without `.gguf`), or its
    `general.name` when the file name is empty of letters."""
    name = _stem(model.name)
    if any(ch.isalpha() for ch in name):
        return ModelIdentity(name[:NAME_MAX], model.name, "file")
    try:
        general = read_gguf_meta(model).name
    except Exception:  # noqa: BLE001 - an unreadable file keeps its file name
        general = None
    if general and str(general).strip():
        return ModelIdentity(str(general).strip()[:NAME_MAX], model.name, "gguf")
    return ModelIdentity(name[:NAME_MAX] or UNKNOWN_MODEL, model.name, "file")


def identity_from_server(props: Any, models: Any = None) -> ModelIdentity:
    """A running server's model from its `/props` and `/v1/models` replies. Pure."""
    path = ""
    if isinstance(props, dict):
        path = str(props.get("model_path") or "")
        alias = props.get("model_alias")
        weights = _file_name(path) if path else ""
        # llama-server's default alias is the model path: then the file name names it.
        if isinstance(alias, str) and alias.strip() and alias != path:
            named = _file_name(alias) if alias.endswith(".gguf") else alias.strip()
            return ModelIdentity(_stem(named)[:NAME_MAX], weights, "props")
        if weights:
            return ModelIdentity(_stem(weights)[:NAME_MAX], weights, "props")
    data = models.get("data") if isinstance(models, dict) else None
    if isinstance(data, list):
        for entry in data:
            ident = entry.get("id") if isinstance(entry, dict) else None
            if isinstance(ident, str) and ident.strip():
                named = _stem(_file_name(ident)) if ident.endswith(".gguf") else ident.strip()
                return ModelIdentity(named[:NAME_MAX], _file_name(path) if path else "", "models")
    return ModelIdentity(UNKNOWN_MODEL, "", "none")


async def url_model_identity(base_url: str, api_key: str | None = None) -> ModelIdentity:
    """Ask a running server which model it serves (`/props`, then `/v1/models`)."""
    props: Any = None
    models: Any = None
    async with llama_client.LlamaClient(base_url, timeout=PROBE_TIMEOUT, api_key=api_key) as client:
        try:
            props = await client.props()
        except LlamaClientError:
            props = None
        found = identity_from_server(props)
        if found.source != "none":
            return found
        try:
            result = await client.request("GET", "/v1/models", timeout=PROBE_TIMEOUT)
            models = result.json if result.ok else None
        except LlamaClientError:
            models = None
    return identity_from_server(props, models)
