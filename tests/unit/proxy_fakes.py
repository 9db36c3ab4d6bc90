"""A scripted upstream for the proxy's unit tests: a real HTTP server (uvicorn on a free
port) that answers like llama-server does for the cases the tests need, and can be told to
be slow, to stream forever, or to report when a client went away.

The integration tests (tests/integration/test_proxy_drill.py) use the real llama-server.
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

PROPS = {
    "model_path": "/models/fake-model.gguf",
    "build_info": "b11434-fake",
    "chat_template": "{{ messages }}",
    "total_slots": 1,
}


def chat_reply(content: str, *, finish: str = "stop") -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 1,
        "model": "fake-model.gguf",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10},
        "timings": {"prompt_n": 7, "predicted_n": 3, "draft_n": 4, "draft_n_accepted": 3},
    }


def sse_chunk(content: str | None, finish: str | None = None) -> bytes:
    delta = {} if content is None else {"content": content}
    chunk = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
    return f"data: {json.dumps(chunk)}\n\n".encode()


class FakeUpstream:
    """ASGI app; behaviour picked by the request's `model` field."""

    def __init__(self) -> None:
        self.release = threading.Event()  # "gated": second chunk waits for this
        self.gate_timed_out = False
        self.cancelled = threading.Event()  # "endless": set when the client went away
        self.requests: list[dict[str, Any]] = []
        self.slow_seconds = 5.0

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                else:
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        headers = {k.decode(): v.decode() for k, v in scope["headers"]}
        self.requests.append({"path": scope["path"], "headers": headers, "body": body})
        path = scope["path"]
        if path == "/props":
            await self._json(send, 200, PROPS)
            return
        if path == "/health":
            await self._json(send, 200, {"status": "ok"}, extra=[(b"x-upstream", b"yes")])
            return
        if path == "/v1/models":
            await self._json(send, 200, {"object": "list", "data": [{"id": "fake-model.gguf"}]})
            return
        try:
            request = json.loads(body)
        except ValueError:
            # llama-server's answer to a body that is not JSON
            error = {
                "code": 500,
                "message": "[json.exception.parse_error.101] parse error",
                "type": "server_error",
            }
            await self._json(send, 500, {"error": error})
            return
        await self._chat(send, receive, request)

    async def _chat(self, send: Any, receive: Any, request: dict[str, Any]) -> None:
        mode = request.get("model", "ok")
        if mode == "ok":
            await self._json(send, 200, chat_reply("Hello there, this is a complete answer."))
        elif mode == "empty":
            await self._json(send, 200, chat_reply(""))
        elif mode == "slow":
            await asyncio.sleep(self.slow_seconds)
            await self._json(send, 200, chat_reply("late"))
        elif mode in ("stream", "gated", "endless"):
            await send(
                {
                    "type": "http.response.start",
                    "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"x-fake", b"1")],
                }
            )
            await send({"type": "http.response.body", "body": sse_chunk("Hel"), "more_body": True})
            if mode == "gated":
                released = await asyncio.to_thread(self.release.wait, 10)
                self.gate_timed_out = not released
            if mode == "endless":
                # Streams until the client (the proxy) goes away, then says so.
                while True:
                    try:
                        message = await asyncio.wait_for(receive(), 0.05)
                    except TimeoutError:
                        await send(
                            {
                                "type": "http.response.body",
                                "body": sse_chunk("la"),
                                "more_body": True,
                            }
                        )
                        continue
                    if message["type"] == "http.disconnect":
                        self.cancelled.set()
                        return
            for part in (
                sse_chunk("lo, a streamed answer."),
                sse_chunk(None, "stop"),
                b"data: [DONE]\n\n",
            ):
                await send({"type": "http.response.body", "body": part, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        else:
            await self._json(
                send,
                400,
                {
                    "error": {
                        "code": 400,
                        "message": "unknown model",
                        "type": "invalid_request_error",
                    }
                },
            )

    @staticmethod
    async def _json(
        send: Any, status: int, value: Any, extra: list[tuple[bytes, bytes]] | None = None
    ) -> None:
        body = json.dumps(value).encode()
        await send(
            {
                "type": "http.response.start",
                "status": status,
                "headers": [
                    (b"content-type", b"application/json; charset=utf-8"),
                    (b"content-length", str(len(body)).encode()),
                    *(extra or []),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body, "more_body": False})


def raw_record(key: str, content: str, *, at: float, client: str = "agent/1") -> dict[str, Any]:
    """A record as the forwarder hands it to the recorder (bytes, as on the wire)."""
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    return {
        "key": key,
        "at": at,
        "method": "POST",
        "path": "/v1/chat/completions",
        "recordable": True,
        "request_body": json.dumps(request).encode(),
        "request_headers": [
            (b"content-type", b"application/json"),
            (b"user-agent", client.encode()),
        ],
        "client": client,
        "status": 200,
        "response_headers": [(b"content-type", b"application/json")],
        "response_chunks": [json.dumps(chat_reply(content)).encode()],
        "elapsed_ms": 12.0,
        "ttfb_ms": 11.0,
        "timed_out": False,
        "transport_error": None,
        "client_disconnected": False,
        "body_truncated": False,
        "upstream_truncated": False,
        "stream": False,
        "identity": {
            "model": "fake-model.gguf",
            "build": "b11434-fake",
            "template_sha256": "a" * 64,
        },
    }
