"""A small real HTTP proxy that rewrites streamed tool-call deltas, for the `stream-format`
drill: no llama-server seen here (b11434, b9589) breaks the OpenAI chunk format, so the drill
puts this proxy between the client and a real llama-server, as a translating gateway would
sit there. Everything it forwards is llama-server's own answer; only the streamed deltas are
rewritten, one documented way (`MODES`):

- `repeat-name`: every later delta of a tool call carries `function.name` again (what some
  gateways and servers send; a client that concatenates deltas shows "get_weatherget_weather");
- `drop-id`: the first delta of a tool call loses its `id` (a client keying calls by id
  loses the call).

Non-streamed answers (`stream: false`) and every other route are forwarded unchanged, so the
same request without streaming is well formed. Run as its own process
(`python -m triage.drills.stream_proxy --upstream URL --port N --mode repeat-name`) by
`running_proxy`, which stops it when the block ends, also on failure. Loopback only.
"""

from __future__ import annotations

import argparse
import http.client
import json
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

from kb.jsontypes import JsonObject
from triage.drills.gateways import free_port

__all__ = ["MODES", "DeltaRewriter", "RunningProxy", "rewrite_line", "running_proxy"]

REPEAT_NAME = "repeat-name"
DROP_ID = "drop-id"
MODES = (REPEAT_NAME, DROP_ID)
# Bounds: a request body the proxy reads, one SSE line it rewrites, and its start-up wait.
MAX_BODY_BYTES = 8 * 1024 * 1024
MAX_LINE_BYTES = 1024 * 1024
READY_TIMEOUT = 120.0  # a Python start-up on a busy 2-core machine; still bounded


@dataclass
class DeltaRewriter:
    """The rewrite state of one stream: the names of the tool calls seen so far, by index."""

    mode: str
    names: dict[tuple[int, int], str] = field(default_factory=dict)
    rewritten: int = 0

    def chunk(self, chunk: JsonObject) -> JsonObject:
        """One chunk, rewritten in place (returned for convenience)."""
        choices = chunk.get("choices")
        for position, choice in enumerate(choices if isinstance(choices, list) else []):
            delta = choice.get("delta") if isinstance(choice, dict) else None
            calls = delta.get("tool_calls") if isinstance(delta, dict) else None
            for call in calls if isinstance(calls, list) else []:
                if isinstance(call, dict):
                    self._call(position, call)
        return chunk

    def _call(self, position: int, call: JsonObject) -> None:
        function = call.get("function")
        index = call.get("index")
        if not isinstance(function, dict) or not isinstance(index, int):
            return
        key = (position, index)
        name = function.get("name")
        if key not in self.names:
            if isinstance(name, str) and name:
                self.names[key] = name
                if self.mode == DROP_ID and "id" in call:
                    del call["id"]
                    self.rewritten += 1
            return
        if self.mode == REPEAT_NAME and not name:
            function["name"] = self.names[key]
            self.rewritten += 1


def rewrite_line(line: bytes, rewriter: DeltaRewriter) -> bytes:
    """One SSE line: a `data:` chunk rewritten, anything else (blank lines, `[DONE]`, event
    names, a line that is not JSON) unchanged."""
    if not line.startswith(b"data:") or len(line) > MAX_LINE_BYTES:
        return line
    payload = line[5:].strip()
    if payload == b"[DONE]":
        return line
    try:
        chunk = json.loads(payload)
    except ValueError:
        return line
    if not isinstance(chunk, dict):
        return line
    ending = line[len(line.rstrip(b"\r\n")) :]
    return b"data: " + json.dumps(rewriter.chunk(chunk)).encode() + ending


def _handler(upstream: str, mode: str) -> type[BaseHTTPRequestHandler]:
    target = urlsplit(upstream)

    class Handler(BaseHTTPRequestHandler):
        # HTTP/1.0: one request per connection, the end of a stream is the connection's end.
        protocol_version = "HTTP/1.0"

        def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib name
            sys.stderr.write(f"stream-proxy: {format % args}\n")

        def do_GET(self) -> None:  # noqa: N802 - stdlib name
            self._forward(b"")

        def do_POST(self) -> None:  # noqa: N802 - stdlib name
            length = int(self.headers.get("Content-Length") or 0)
            if length > MAX_BODY_BYTES:
                self.send_error(413, f"request body over {MAX_BODY_BYTES} bytes")
                return
            self._forward(self.rfile.read(length))

        def _forward(self, body: bytes) -> None:
            conn = http.client.HTTPConnection(target.hostname or "127.0.0.1", target.port, 600)
            headers = {
                k: v
                for k, v in self.headers.items()
                if k.lower() not in ("host", "connection", "content-length", "accept-encoding")
            }
            if body:
                headers["Content-Length"] = str(len(body))
            try:
                conn.request(self.command, self.path, body or None, headers)
                reply = conn.getresponse()
                streamed = "text/event-stream" in (reply.getheader("Content-Type") or "")
                self.send_response(reply.status)
                for key, value in reply.getheaders():
                    if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                        self.send_header(key, value)
                if not streamed:
                    data = reply.read()
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.end_headers()
                rewriter = DeltaRewriter(mode)
                while line := reply.readline(MAX_LINE_BYTES + 1):
                    self.wfile.write(rewrite_line(line, rewriter))
                    self.wfile.flush()
            except (OSError, http.client.HTTPException) as exc:
                sys.stderr.write(f"stream-proxy: upstream {upstream}: {exc}\n")
            finally:
                conn.close()

    return Handler


@dataclass
class RunningProxy:
    """The proxy process: its URL, its upstream and mode, and its log."""

    url: str
    upstream: str
    mode: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, chars: int = 2000) -> str:
        try:
            return self.log_path.read_text("utf-8", errors="replace")[-chars:]
        except OSError:
            return ""


def _wait_ready(proxy: RunningProxy) -> None:
    deadline = time.monotonic() + READY_TIMEOUT
    while time.monotonic() < deadline:
        if proxy.process.poll() is not None:
            raise RuntimeError(f"stream proxy exited: {proxy.log_tail()}")
        try:
            httpx.get(proxy.url + "/health", timeout=5)
            return
        except httpx.HTTPError:
            time.sleep(0.1)
    raise RuntimeError(f"stream proxy did not answer in {READY_TIMEOUT:g} s: {proxy.log_tail()}")


@contextmanager
def running_proxy(upstream: str, folder: Path, mode: str = REPEAT_NAME) -> Iterator[RunningProxy]:
    """Start the rewriting proxy in front of `upstream` on a free loopback port; stop it
    when the block ends, also on failure."""
    if mode not in MODES:
        raise ValueError(f"unknown rewrite mode {mode!r}; known: {', '.join(MODES)}")
    folder.mkdir(parents=True, exist_ok=True)
    port = free_port()
    log_path = folder / "stream-proxy.log"
    argv = [sys.executable, "-m", __name__, "--upstream", upstream, "--port", str(port)]
    with log_path.open("wb") as log:
        process = subprocess.Popen([*argv, "--mode", mode], stdout=log, stderr=log)
    proxy = RunningProxy(f"http://127.0.0.1:{port}", upstream, mode, process, log_path)
    try:
        _wait_ready(proxy)
        yield proxy
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m triage.drills.stream_proxy")
    parser.add_argument("--upstream", required=True, help="llama-server's URL")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--mode", choices=MODES, default=REPEAT_NAME)
    args = parser.parse_args(argv)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), _handler(args.upstream, args.mode))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
