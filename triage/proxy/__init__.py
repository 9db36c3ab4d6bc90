"""Live recording proxy: forward to llama-server, record, measure failure rates, open
incidents (`triage proxy`)."""

from triage.proxy.forward import ProxyApp, ProxyConfig, identity_from_props
from triage.proxy.metrics import ProxyMetrics
from triage.proxy.prepare import prepare
from triage.proxy.rates import Detection, detect, failure_signature
from triage.proxy.recorder import Recorder
from triage.proxy.recorder_process import RecorderProcess, RecorderProcessError
from triage.proxy.server import ThreadedServer, parse_listen, serving

__all__ = [
    "Detection",
    "ProxyApp",
    "ProxyConfig",
    "ProxyMetrics",
    "Recorder",
    "RecorderProcess",
    "RecorderProcessError",
    "ThreadedServer",
    "detect",
    "failure_signature",
    "identity_from_props",
    "parse_listen",
    "prepare",
    "serving",
]
