"""The proxy's response relay: the upstream's body to the client chunk by chunk as it
arrives, a copy (bounded) into the exchange's record, and what to do when either side goes
away mid-response (triage.proxy.forward sends the request and owns the rest)."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from triage.proxy.record import ExchangeRecord

__all__ = ["Message", "Receive", "Send", "stream_body"]

Message = dict[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]


class _Disconnected(Exception):
    """The client went away while the response was being sent."""


async def stream_body(
    response: aiohttp.ClientResponse,
    receive: Receive,
    send: Send,
    record: ExchangeRecord,
    *,
    max_record_bytes: int,
    read_timeout: float,
) -> None:
    """Pump the upstream body to the client; stop (closing upstream) if the client leaves.
    The record gets the first `max_record_bytes` of the body and what went wrong, if anything."""
    pump = asyncio.create_task(_pump(response, send, record, max_record_bytes, read_timeout))
    watch = asyncio.create_task(_wait_disconnect(receive))
    done, _ = await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
    if pump not in done:
        pump.cancel()
        record["client_disconnected"] = True
    else:
        watch.cancel()
    results = await asyncio.gather(pump, watch, return_exceptions=True)
    outcome = results[0]
    if isinstance(outcome, _Disconnected):
        record["client_disconnected"] = True
    elif isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError):
        raise outcome


async def _pump(
    response: aiohttp.ClientResponse,
    send: Send,
    record: ExchangeRecord,
    cap: int,
    read_timeout: float,
) -> None:
    chunks: list[bytes] = record["response_chunks"]
    kept = 0
    last_read = time.perf_counter()
    last = b""
    try:
        async for chunk in response.content.iter_any():
            last_read = time.perf_counter()
            if not chunk:
                continue
            last = chunk
            try:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            except OSError as exc:  # uvicorn's ClientDisconnected is an OSError
                raise _Disconnected() from exc
            if kept < cap:
                chunks.append(chunk[: cap - kept])
                kept += min(len(chunk), cap - kept)
                if kept >= cap:
                    record["body_truncated"] = True
    except asyncio.TimeoutError:
        # The upstream went quiet mid-response: the status is already sent.
        record["timed_out"] = True
        cut = f"upstream sent nothing for {read_timeout:g} s mid-response"
    except aiohttp.ClientError as exc:
        cut = f"upstream closed mid-response ({type(exc).__name__})"
        record["transport_error"] = cut
        record["upstream_truncated"] = True
    else:
        cut = ""
    if cut:
        # A cut reply is cut for the client too: a stream gets an error event (the
        # shape llama-server itself sends), then the connection is aborted (no final
        # chunk, no [DONE]) by the caller -- never a clean end a client takes for done.
        record["_cut"] = cut
        if "text/event-stream" in response.headers.get("content-type", ""):
            event = _sse_error_event(cut, ends_event=_ends_event(last))
            try:
                await send({"type": "http.response.body", "body": event, "more_body": True})
            except OSError as exc:
                raise _Disconnected() from exc
        return
    try:
        await send({"type": "http.response.body", "body": b"", "more_body": False})
    except OSError as exc:
        raise _Disconnected() from exc
    # The proxy's share of the last byte's latency (the overhead histogram).
    record["_tail_seconds"] = time.perf_counter() - last_read


def _ends_event(last: bytes) -> bool:
    """The bytes sent so far (`last`: the last chunk) end an SSE event, or none were sent."""
    return not last or last.endswith((b"\n\n", b"\r\n\r\n"))


def _sse_error_event(message: str, *, ends_event: bool) -> bytes:
    """`data: {"error": {...}}` as llama-server sends a mid-stream error; after a blank
    line first when the upstream stopped inside an event."""
    error = {"error": {"code": 502, "message": message, "type": "upstream_error"}}
    return (b"" if ends_event else b"\n\n") + b"data: " + json.dumps(error).encode() + b"\n\n"


async def _wait_disconnect(receive: Receive) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
