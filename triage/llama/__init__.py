"""Everything llama-server specific: build, launch, talk to it, read GGUF metadata."""

from triage.llama.build import (
    BuildError,
    ServerBinaryNotFound,
    binary_build_info,
    build_server,
    find_server_binary,
)
from triage.llama.client import (
    ChatResult,
    HttpResult,
    LlamaClient,
    LlamaClientError,
    StreamResult,
)
from triage.llama.gguf_meta import GGUFMeta, GGUFMetaError, read_gguf_meta
from triage.llama.launcher import (
    RunningServer,
    ServerCrashed,
    ServerSpec,
    ServerStartError,
    launch,
    running_servers,
    start,
)

__all__ = [
    "BuildError",
    "ChatResult",
    "GGUFMeta",
    "GGUFMetaError",
    "HttpResult",
    "LlamaClient",
    "LlamaClientError",
    "RunningServer",
    "ServerBinaryNotFound",
    "ServerCrashed",
    "ServerSpec",
    "ServerStartError",
    "StreamResult",
    "binary_build_info",
    "build_server",
    "find_server_binary",
    "launch",
    "read_gguf_meta",
    "running_servers",
    "start",
]
