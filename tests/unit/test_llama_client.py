"""LlamaClient against httpx.MockTransport: parsing, SSE reassembly, errors, timeouts."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from triage.llama.client import LlamaClient, LlamaClientError, safe_headers

BASE = "http://llama.test"


def client_for(handler) -> LlamaClient:
    return LlamaClient(BASE, timeout=2.0, transport=httpx.MockTransport(handler))


def run(coro):
    return asyncio.run(coro)


def sse(*events: str) -> bytes:
    return "".join(f"{event}\n\n" for event in events).encode()


CHAT_JSON = {
    "choices": [
        {
            "finish_reason": "length",
            "message": {"role": "assistant", "content": "", "reasoning_content": "x" * 40},
        }
    ],
    "usage": {"completion_tokens": 800},
    "timings": {"predicted_n": 800, "draft_n": 10, "draft_n_accepted": 8},
}


def test_chat_parses_message_and_keeps_raw_bytes():
    seen = {}

    def handler(request: httpx.Request) -> httpx.Response:
        seen["body"] = json.loads(request.content)
        seen["path"] = request.url.path
        return httpx.Response(200, json=CHAT_JSON, headers={"Set-Cookie": "s=1", "X-Extra": "kept"})

    async def go():
        async with client_for(handler) as client:
            return await client.chat({"messages": [], "stream": True})

    result = run(go())
    assert seen["path"] == "/v1/chat/completions"
    assert seen["body"]["stream"] is False  # chat() is the non-streaming call
    assert result.ok and result.status_code == 200
    assert result.finish_reason == "length"
    assert result.content == "" and len(result.reasoning_content) == 40
    assert result.timings["draft_n_accepted"] == 8
    assert result.usage == {"completion_tokens": 800}
    assert json.loads(result.raw) == CHAT_JSON
    assert "set-cookie" not in result.headers and result.headers["x-extra"] == "kept"
    assert result.elapsed >= 0


def test_chat_http_error_is_a_result_not_an_exception():
    body = {"error": {"code": 500, "message": "does not match the expected peg-gemma4 format"}}

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(500, json=body)

    async def go():
        async with client_for(handler) as client:
            return await client.chat({"messages": []})

    result = run(go())
    assert not result.ok and result.status_code == 500
    assert "peg-gemma4" in result.error
    assert result.content == "" and result.finish_reason is None


def test_chat_non_json_body():
    async def go():
        async with client_for(lambda r: httpx.Response(502, content=b"<html>bad</html>")) as c:
            return await c.chat({"messages": []})

    result = run(go())
    assert result.json is None and result.raw == b"<html>bad</html>"


def test_safe_headers_drops_credentials():
    headers = {"Authorization": "Bearer x", "Cookie": "a", "X-Api-Key": "k", "Content-Type": "j"}
    assert safe_headers(headers) == {"content-type": "j"}


STREAM = sse(
    'data: {"choices":[{"delta":{"role":"assistant","content":null}}]}',
    'data: {"choices":[{"delta":{"reasoning_content":"think "}}]}',
    'data: {"choices":[{"delta":{"reasoning_content":"more"}}]}',
    'data: {"choices":[{"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",'
    '"function":{"name":"get_weather","arguments":"{\\"loc"}}]}}]}',
    'data: {"choices":[{"delta":{"tool_calls":[{"index":0,'
    '"function":{"arguments":"ation\\":\\"Paris\\"}"}}]}}]}',
    'data: {"choices":[{"delta":{"content":"Hi"}}]}',
    'data: {"choices":[{"delta":{},"finish_reason":"tool_calls"}],'
    '"usage":{"completion_tokens":9},"timings":{"predicted_n":9}}',
    "data: [DONE]",
)


def stream_handler(payload: bytes, status: int = 200, content_type: str = "text/event-stream"):
    def handler(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["stream"] is True
        return httpx.Response(status, content=payload, headers={"Content-Type": content_type})

    return handler


def test_stream_reassembles_everything():
    async def go():
        async with client_for(stream_handler(STREAM)) as client:
            return await client.chat_stream({"messages": []})

    result = run(go())
    assert result.ok and result.done
    assert result.reasoning_content == "think more"
    assert result.content == "Hi"
    assert result.finish_reason == "tool_calls"
    assert result.tool_calls == [
        {
            "id": "c1",
            "type": "function",
            "function": {"name": "get_weather", "arguments": '{"location":"Paris"}'},
        }
    ]
    assert result.usage == {"completion_tokens": 9} and result.timings == {"predicted_n": 9}
    assert result.raw == STREAM  # byte for byte
    assert len(result.chunks) == 7


def test_stream_data_error_object():
    payload = sse(
        'data: {"choices":[{"delta":{"content":"par"}}]}',
        'data: {"error":{"code":500,"message":"boom","type":"server_error"}}',
    )

    async def go():
        async with client_for(stream_handler(payload)) as client:
            return await client.chat_stream({"messages": []})

    result = run(go())
    assert not result.ok
    assert result.error["message"] == "boom" and result.error_message == "boom"
    assert result.content == "par" and not result.done


def test_stream_bare_error_field_of_older_builds():
    payload = sse(
        'data: {"choices":[{"delta":{"content":"par"}}]}',
        'error: {"code":500,"message":"old style"}',
    )

    async def go():
        async with client_for(stream_handler(payload)) as client:
            return await client.chat_stream({"messages": []})

    result = run(go())
    assert not result.ok and result.error_message == "old style"


def test_stream_http_error_before_streaming():
    body = json.dumps({"error": {"code": 400, "message": "bad request"}}).encode()

    async def go():
        handler = stream_handler(body, status=400, content_type="application/json")
        async with client_for(handler) as client:
            return await client.chat_stream({"messages": []})

    result = run(go())
    assert result.status_code == 400 and not result.ok
    assert result.error_message == "bad request" and result.raw == body


def test_stream_without_done_but_with_finish_is_ok():
    payload = sse('data: {"choices":[{"delta":{"content":"x"},"finish_reason":"stop"}]}')

    async def go():
        async with client_for(stream_handler(payload)) as client:
            return await client.chat_stream({"messages": []})

    result = run(go())
    assert result.ok and not result.done and result.finish_reason == "stop"


def test_connect_error_is_clear():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("Connection refused", request=request)

    async def go():
        async with client_for(handler) as client:
            await client.chat({"messages": []})

    with pytest.raises(LlamaClientError, match="cannot connect") as info:
        run(go())
    assert info.value.kind == "connect"


def test_dropped_connection_is_clear():
    def handler(request: httpx.Request) -> httpx.Response:
        raise httpx.RemoteProtocolError("Server disconnected", request=request)

    async def go():
        async with client_for(handler) as client:
            await client.chat_stream({"messages": []})

    with pytest.raises(LlamaClientError, match="broke mid-request") as info:
        run(go())
    assert info.value.kind == "disconnected"


def test_deadline_applies_to_the_whole_request():
    async def handler(request: httpx.Request) -> httpx.Response:
        await asyncio.sleep(30)
        return httpx.Response(200, json={})

    async def go():
        client = LlamaClient(BASE, timeout=0.3, transport=httpx.MockTransport(handler))
        async with client:
            await client.chat({"messages": []})

    loop_start = asyncio.run(_now())
    with pytest.raises(LlamaClientError, match="within 0.3s") as info:
        run(go())
    assert info.value.kind == "timeout"
    assert asyncio.run(_now()) - loop_start < 5


async def _now() -> float:
    return asyncio.get_running_loop().time()


def test_inspection_endpoints():
    def handler(request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/health":
            return httpx.Response(503, json={"error": {"message": "Loading model"}})
        if path == "/props":
            return httpx.Response(200, json={"chat_template": "T", "build_info": "b11434-sdist"})
        if path == "/apply-template":
            assert json.loads(request.content)["messages"] == [{"role": "user", "content": "q"}]
            return httpx.Response(200, json={"prompt": "<|turn>system\n<|think|>\n"})
        if path == "/tokenize":
            body = json.loads(request.content)
            assert body["parse_special"] is True and body["add_special"] is False
            return httpx.Response(200, json={"tokens": [7, 280]})
        if path == "/slots":
            return httpx.Response(200, json=[{"id": 0, "is_processing": False}])
        if path == "/metrics":
            return httpx.Response(501, json={"error": {"message": "metrics disabled"}})
        return httpx.Response(404)

    async def go():
        async with client_for(handler) as client:
            health = await client.health()
            props = await client.props()
            prompt = await client.apply_template({"messages": [{"role": "user", "content": "q"}]})
            tokens = await client.tokenize("<|channel>thought")
            slots = await client.slots()
            with pytest.raises(LlamaClientError, match="HTTP 501: metrics disabled"):
                await client.metrics()
            return health, props, prompt, tokens, slots

    health, props, prompt, tokens, slots = run(go())
    assert health.status_code == 503 and health.error == "Loading model"
    assert props["build_info"] == "b11434-sdist"
    assert "<|think|>" in prompt
    assert tokens == [7, 280]
    assert slots[0]["id"] == 0


def test_api_key_is_sent_but_not_kept():
    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer sekrit"
        return httpx.Response(200, json=CHAT_JSON, headers={"Authorization": "echo"})

    async def go():
        client = LlamaClient(BASE, transport=httpx.MockTransport(handler), api_key="sekrit")
        async with client:
            return await client.chat({"messages": []})

    result = run(go())
    assert "authorization" not in result.headers
    assert b"sekrit" not in result.raw
