"""Async HTTP client for llama-server: chat (plain and SSE) and the inspection endpoints.

Every call has an explicit deadline, and every answer keeps its raw bytes, so a result can
be stored as evidence exactly as it came off the wire. Transport failures (refused, timed
out, connection dropped because the server died) raise `LlamaClientError`; HTTP errors do
not raise from `chat`/`chat_stream`, they are results like any other.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import EventSource

from kb.jsontypes import JsonObject
from triage.capture.redact import is_secret_header
from triage.llama.endpoints import endpoint_of

DEFAULT_TIMEOUT = 120.0
CONNECT_TIMEOUT = 10.0
CHAT_PATH = "/v1/chat/completions"

# Response headers never stored with evidence.


class LlamaClientError(RuntimeError):
    """The request did not complete: kind is connect, timeout, disconnected or http.

    `report` is a triage.llama.crash.CrashReport when the caller found out why (the server it
    launched died or hung, see RunningServer.explain); None otherwise."""

    def __init__(self, message: str, *, kind: str, url: str, report: Any = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.url = url
        self.report = report


def safe_headers(headers: Mapping[str, str]) -> dict[str, str]:
    """Response headers without credentials or cookies."""
    return {k.lower(): v for k, v in headers.items() if not is_secret_header(k)}


def _json_or_none(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return None


def _error_message(payload: Any) -> str | None:
    if not isinstance(payload, dict) or "error" not in payload:
        return None
    error = payload["error"]
    if isinstance(error, dict):
        return str(error.get("message") or json.dumps(error, default=str)[:500])
    return str(error)


@dataclass
class HttpResult:
    """One HTTP exchange as evidence: status, parsed JSON (if any), raw body, timing."""

    status_code: int
    json: Any
    raw: bytes
    elapsed: float
    headers: dict[str, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        """True for a 2xx status."""
        return 200 <= self.status_code < 300

    @property
    def error(self) -> str | None:
        """The server's error message, if the body is an error object."""
        return _error_message(self.json)


@dataclass
class ChatResult(HttpResult):
    """A non-streaming chat completion."""

    def _choice(self) -> JsonObject:
        if isinstance(self.json, dict) and self.json.get("choices"):
            choice = self.json["choices"][0]
            return choice if isinstance(choice, dict) else {}
        return {}

    @property
    def message(self) -> JsonObject:
        """choices[0].message (empty dict when absent)."""
        message = self._choice().get("message")
        return message if isinstance(message, dict) else {}

    @property
    def content(self) -> str:
        """choices[0].message.content ('' when null or absent)."""
        return self.message.get("content") or ""

    @property
    def reasoning_content(self) -> str:
        """choices[0].message.reasoning_content ('' when absent)."""
        return self.message.get("reasoning_content") or ""

    @property
    def tool_calls(self) -> list[JsonObject]:
        """choices[0].message.tool_calls ([] when absent)."""
        return list(self.message.get("tool_calls") or [])

    @property
    def finish_reason(self) -> str | None:
        """choices[0].finish_reason."""
        return self._choice().get("finish_reason")

    @property
    def timings(self) -> JsonObject:
        """llama-server's timings block ({} when absent)."""
        value = self.json.get("timings") if isinstance(self.json, dict) else None
        return value if isinstance(value, dict) else {}

    @property
    def usage(self) -> JsonObject:
        """OpenAI usage block ({} when absent)."""
        value = self.json.get("usage") if isinstance(self.json, dict) else None
        return value if isinstance(value, dict) else {}


@dataclass
class StreamResult:
    """A streamed chat completion, reassembled from its SSE chunks."""

    status_code: int
    raw: bytes
    elapsed: float
    headers: dict[str, str] = field(default_factory=dict)
    chunks: list[Any] = field(default_factory=list)
    content: str = ""
    reasoning_content: str = ""
    tool_calls: list[JsonObject] = field(default_factory=list)  # as the reply holds them
    finish_reason: str | None = None
    usage: JsonObject = field(default_factory=dict)
    timings: JsonObject = field(default_factory=dict)
    error: Any = None
    done: bool = False
    json: Any = None  # the error body when the server answered without streaming
    first_chunk_seconds: float | None = None

    @property
    def ok(self) -> bool:
        """HTTP 2xx, no error event, and the stream ended with [DONE] or a finish_reason."""
        return (
            200 <= self.status_code < 300
            and self.error is None
            and (self.done or self.finish_reason is not None)
        )

    @property
    def error_message(self) -> str | None:
        """Human-readable text of the error (event or HTTP body)."""
        if self.error is None:
            return _error_message(self.json)
        if isinstance(self.error, dict):
            return str(self.error.get("message") or json.dumps(self.error, default=str)[:500])
        return str(self.error)


class _StreamAssembler:
    """Folds OpenAI chat.completion.chunk deltas into one message."""

    def __init__(self, result: StreamResult) -> None:
        self.result = result
        self.calls: dict[int, JsonObject] = {}  # tool calls by index, as the deltas build them

    def add(self, chunk: Any) -> None:
        result = self.result
        result.chunks.append(chunk)
        if not isinstance(chunk, dict):
            return
        if "error" in chunk:
            result.error = chunk["error"]
            return
        if isinstance(chunk.get("usage"), dict):
            result.usage = chunk["usage"]
        if isinstance(chunk.get("timings"), dict):
            result.timings = chunk["timings"]
        for choice in chunk.get("choices") or []:
            if not isinstance(choice, dict):
                continue
            if choice.get("finish_reason"):
                result.finish_reason = choice["finish_reason"]
            delta = choice.get("delta") or {}
            if delta.get("content"):
                result.content += delta["content"]
            if delta.get("reasoning_content"):
                result.reasoning_content += delta["reasoning_content"]
            for call in delta.get("tool_calls") or []:
                self._add_call(call)
        result.tool_calls = [self.calls[i] for i in sorted(self.calls)]

    def _add_call(self, delta: JsonObject) -> None:
        index = int(delta.get("index", len(self.calls)))
        call = self.calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if delta.get("id"):
            call["id"] = delta["id"]
        if delta.get("type"):
            call["type"] = delta["type"]
        function = delta.get("function") or {}
        if function.get("name"):
            call["function"]["name"] += function["name"]
        if function.get("arguments"):
            call["function"]["arguments"] += function["arguments"]


class _RecordingStream(httpx.AsyncByteStream):
    """Passes the response body through while keeping a copy of every byte."""

    def __init__(self, inner: httpx.AsyncByteStream | httpx.SyncByteStream) -> None:
        if not isinstance(inner, httpx.AsyncByteStream):
            raise TypeError("the async client yields async byte streams")
        self.inner = inner
        self.chunks: list[bytes] = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self.inner:
            self.chunks.append(chunk)
            yield chunk

    async def aclose(self) -> None:
        await self.inner.aclose()


def _bare_error_fields(raw: bytes) -> list[Any]:
    """Older llama-server builds sent mid-stream errors as a bare `error:` SSE field, which
    SSE parsers ignore (unknown field); find them in the raw bytes."""
    found = []
    for line in raw.decode("utf-8", errors="replace").splitlines():
        if line.startswith("error:"):
            value = line[len("error:") :].strip()
            parsed = _json_or_none(value.encode())
            found.append(parsed if parsed is not None else value)
    return found


class LlamaClient:
    """Talks to one llama-server over HTTP (async)."""

    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        transport: httpx.AsyncBaseTransport | None = None,
        api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._client = httpx.AsyncClient(
            base_url=self.base_url,
            timeout=httpx.Timeout(timeout, connect=min(CONNECT_TIMEOUT, timeout)),
            transport=transport,
            headers=headers,
            trust_env=False,  # loopback servers: never route through an HTTP proxy
            # Plain http never uses TLS; skipping the CA bundle saves ~17 ms per client
            # (the engine opens one per look). https keeps full verification.
            verify=not self.base_url.startswith("http://"),
        )

    async def __aenter__(self) -> LlamaClient:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the connection pool."""
        await self._client.aclose()

    # --- transport --------------------------------------------------------------------

    def _fail(self, exc: BaseException, path: str, timeout: float) -> LlamaClientError:
        url = f"{self.base_url}{path}"
        if isinstance(exc, (TimeoutError, httpx.TimeoutException)):
            return LlamaClientError(
                f"no complete answer from {url} within {timeout:g}s", kind="timeout", url=url
            )
        if isinstance(exc, httpx.ConnectError):
            return LlamaClientError(
                f"cannot connect to llama-server at {url}: {exc}", kind="connect", url=url
            )
        return LlamaClientError(
            f"connection to {url} broke mid-request ({type(exc).__name__}: {exc}); "
            "the server may have crashed or been killed",
            kind="disconnected",
            url=url,
        )

    async def request(
        self,
        method: str,
        path: str,
        *,
        json_body: Any = None,
        timeout: float | None = None,
    ) -> HttpResult:
        """One request; the whole exchange must finish within `timeout` seconds."""
        limit = timeout or self.timeout
        started = time.monotonic()
        try:
            async with asyncio.timeout(limit):
                # An explicit limit also bounds httpx's own read/write timeouts (set for the
                # client's default limit), or a longer limit would end at the default one.
                response = await self._client.request(
                    method,
                    path,
                    json=json_body,
                    timeout=httpx.Timeout(limit, connect=min(CONNECT_TIMEOUT, limit)),
                )
                raw = await response.aread()
        except (TimeoutError, httpx.HTTPError) as exc:
            raise self._fail(exc, path, limit) from exc
        return HttpResult(
            status_code=response.status_code,
            json=_json_or_none(raw),
            raw=raw,
            elapsed=time.monotonic() - started,
            headers=safe_headers(response.headers),
        )

    async def _get_json(self, path: str, timeout: float | None = None) -> Any:
        result = await self.request("GET", path, timeout=timeout)
        return self._expect_ok(result, path)

    def _expect_ok(self, result: HttpResult, path: str) -> Any:
        if not result.ok:
            detail = result.error or result.raw[:300].decode("utf-8", errors="replace")
            raise LlamaClientError(
                f"{self.base_url}{path} answered HTTP {result.status_code}: {detail}",
                kind="http",
                url=f"{self.base_url}{path}",
            )
        return result.json

    # --- chat ---------------------------------------------------------------------------

    async def chat(self, body: JsonObject, *, timeout: float | None = None) -> ChatResult:
        """POST /v1/chat/completions (non-streaming); HTTP errors are returned, not raised.
        An embeddings or rerank body (`input`, `query` + `documents`: see
        triage.llama.endpoints) goes to /v1/embeddings or /v1/rerank instead, so a replay
        reaches the endpoint its captured request was for."""
        payload = {**body, "stream": False}
        path = endpoint_of(payload).path
        result = await self.request("POST", path, json_body=payload, timeout=timeout)
        return ChatResult(**vars(result))

    async def chat_stream(self, body: JsonObject, *, timeout: float | None = None) -> StreamResult:
        """POST /v1/chat/completions with stream=true, reassembling the SSE chunks."""
        limit = timeout or self.timeout
        payload = {**body, "stream": True}
        started = time.monotonic()
        recorder: _RecordingStream | None = None
        result = StreamResult(status_code=0, raw=b"", elapsed=0.0)
        try:
            async with asyncio.timeout(limit):
                async with self._client.stream(
                    "POST",
                    CHAT_PATH,
                    json=payload,
                    headers={"Accept": "text/event-stream", "Cache-Control": "no-store"},
                ) as response:
                    result.status_code = response.status_code
                    result.headers = safe_headers(response.headers)
                    content_type = response.headers.get("content-type", "")
                    if response.status_code != 200 or "text/event-stream" not in content_type:
                        result.raw = await response.aread()
                        result.json = _json_or_none(result.raw)
                        if result.status_code == 200:
                            result.error = f"expected an event stream, got {content_type!r}"
                        result.elapsed = time.monotonic() - started
                        return result
                    try:  # a body that is already in memory (e.g. MockTransport)
                        result.raw = response.content
                    except httpx.ResponseNotRead:
                        recorder = _RecordingStream(response.stream)
                        response.stream = recorder
                    assembler = _StreamAssembler(result)
                    async for event in EventSource(response).aiter_sse():
                        if result.first_chunk_seconds is None:
                            result.first_chunk_seconds = time.monotonic() - started
                        if event.data.strip() == "[DONE]":
                            result.done = True
                            break
                        if event.event == "error":
                            parsed = _json_or_none(event.data.encode())
                            result.error = parsed if parsed is not None else event.data
                            break
                        chunk = _json_or_none(event.data.encode())
                        assembler.add(chunk if chunk is not None else event.data)
                        if result.error is not None:
                            break
        except (TimeoutError, httpx.HTTPError) as exc:
            raise self._fail(exc, CHAT_PATH, limit) from exc
        result.raw = b"".join(recorder.chunks) if recorder else result.raw
        if result.error is None:
            bare = _bare_error_fields(result.raw)
            if bare:
                result.error = bare[0]
        result.elapsed = time.monotonic() - started
        return result

    # --- inspection endpoints ----------------------------------------------------------

    async def health(self, *, timeout: float | None = 5.0) -> HttpResult:
        """GET /health: 200 when ready, 503 while the model loads."""
        return await self.request("GET", "/health", timeout=timeout)

    async def props(self) -> JsonObject:
        """GET /props: chat_template, model_path, build_info, default settings..."""
        return dict(await self._get_json("/props"))

    async def apply_template(self, body: JsonObject) -> str:
        """POST /apply-template: the prompt the server would feed the model."""
        path = "/apply-template"
        result = await self.request("POST", path, json_body=body)
        payload = self._expect_ok(result, path)
        return str(payload.get("prompt", ""))

    async def tokenize(
        self, text: str, *, parse_special: bool = True, with_pieces: bool = False
    ) -> list[Any]:
        """POST /tokenize: token ids (or {id, piece} objects with `with_pieces`)."""
        path = "/tokenize"
        body = {
            "content": text,
            "add_special": False,
            "parse_special": parse_special,
            "with_pieces": with_pieces,
        }
        result = await self.request("POST", path, json_body=body)
        return list(self._expect_ok(result, path).get("tokens", []))

    async def slots(self) -> list[JsonObject]:
        """GET /slots: per-slot state."""
        return list(await self._get_json("/slots"))

    async def metrics(self) -> str:
        """GET /metrics: Prometheus text (the server needs --metrics)."""
        path = "/metrics"
        result = await self.request("GET", path)
        self._expect_ok(result, path)
        return result.raw.decode("utf-8", errors="replace")
