"""Gateway answers written the way other gateways write them (none of them is a drill's):
each must read as the gateway's answer, not llama-server's, and never as a server crash or
hang by itself; llama-server's own errors must not."""

from __future__ import annotations

import json
from typing import Any

import pytest

from triage.capture import exchange_from_http
from triage.drills import gateways
from triage.symptoms import classify

REQUEST = {"model": "m", "messages": [{"role": "user", "content": "write a long essay"}]}

CLOUDFLARE_524 = (
    '<!DOCTYPE html>\n<!--[if lt IE 7]> <html class="no-js ie6 oldie" lang="en-US"> '
    "<![endif]-->\n<head>\n<title>llm.example.com | 524: A timeout occurred</title>\n</head>"
    "<body>Error code 524</body></html>"
)
HAPROXY_504 = (
    "<html><body><h1>504 Gateway Time-out</h1>\nThe server didn't respond in time.\n"
    "</body></html>\n"
)
AWS_ALB_502 = (
    "<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n<center><h1>502 Bad "
    "Gateway</h1></center>\r\n</body>\r\n</html>\r\n"
)


def _failed(body: Any, status: int, elapsed_ms: float | None = None) -> dict[str, str]:
    exchange = exchange_from_http(REQUEST, body, status=status, elapsed_ms=elapsed_ms)
    return {f.kind: f.reason for f in classify(exchange) if not f.passed}


@pytest.mark.parametrize(
    ("body", "status", "elapsed_ms", "says"),
    [
        (CLOUDFLARE_524, 524, 100_500, "a common 100 s gateway/client deadline"),
        (HAPROXY_504, 504, 50_000, "504 Gateway Time-out"),
        (AWS_ALB_502, 502, 1_200, "502 Bad Gateway"),
        ("Gateway Timeout", 504, 30_010, "a common 30 s gateway/client deadline"),  # Traefik
        ("upstream request timeout", 504, 15_000, "upstream request timeout"),  # Envoy
        # A vendor router's JSON error: llama-server never answers 504 itself.
        ({"error": {"message": "Upstream timed out", "code": 504}}, 504, 120_000, "JSON error"),
        ({"detail": "Gateway Timeout"}, 504, None, "Gateway Timeout"),
        ({"error": "upstream connect error or disconnect/reset"}, 502, None, "upstream connect"),
    ],
)
def test_other_gateways_pages_are_gateway_errors_not_crashes_or_hangs(
    body: Any, status: int, elapsed_ms: float | None, says: str
) -> None:
    failed = _failed(body, status, elapsed_ms)
    assert says in failed["gateway-error"]
    assert not set(failed) & {"server-crash", "server-hang"}


@pytest.mark.parametrize(
    ("body", "status"),
    [
        ({"error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}}, 503),
        (
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                }
            },
            400,
        ),
        ({"error": {"code": 500, "message": "Failed to parse input at pos 3"}}, 500),
        # A timeout word in llama-server's own 500 is still the server's answer.
        ({"error": {"code": 500, "message": "upstream timed out"}}, 500),
    ],
)
def test_llama_servers_own_json_errors_are_not_gateway_errors(body: Any, status: int) -> None:
    assert "gateway-error" not in _failed(json.dumps(body), status)


def test_the_triage_proxys_own_504_stays_a_transport_failure_not_a_gateway() -> None:
    own = {"error": {"code": 504, "message": "upstream timed out", "type": "upstream_error"}}
    assert "gateway-error" not in _failed(own, 504)


def test_the_gateway_start_wait_is_bounded_and_set_by_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(gateways.READY_TIMEOUT_ENV, raising=False)
    assert gateways.ready_timeout() == gateways.READY_TIMEOUT >= 600
    monkeypatch.setenv(gateways.READY_TIMEOUT_ENV, "900")
    assert gateways.ready_timeout() == 900
    for bad in ("soon", "0", "-5", "1e9"):
        monkeypatch.setenv(gateways.READY_TIMEOUT_ENV, bad)
        with pytest.raises(gateways.GatewayError, match=gateways.READY_TIMEOUT_ENV):
            gateways.ready_timeout()
