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
from triage.llama.crash import CrashReport, crash_report, host_cpu_flags, host_has_amx
from triage.llama.gguf_meta import GGUFMeta, GGUFMetaError, read_gguf_meta
from triage.llama.launcher import (
    RunningServer,
    ServerCrashed,
    ServerHung,
    ServerSpec,
    ServerStartError,
    launch,
    running_servers,
    start,
)

__all__ = [
    "BuildError",
    "ChatResult",
    "CrashReport",
    "GGUFMeta",
    "GGUFMetaError",
    "HttpResult",
    "LlamaClient",
    "LlamaClientError",
    "RunningServer",
    "ServerBinaryNotFound",
    "ServerCrashed",
    "ServerHung",
    "ServerSpec",
    "ServerStartError",
    "StreamResult",
    "binary_build_info",
    "build_server",
    "crash_report",
    "find_server_binary",
    "host_cpu_flags",
    "host_has_amx",
    "launch",
    "read_gguf_meta",
    "running_servers",
    "start",
]
