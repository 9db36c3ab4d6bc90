"""Built-in check `gateway-error`: the answer is a gateway's own error page, not llama-server's.

Clients often reach llama-server through a gateway (nginx, LiteLLM, llama-swap, a vendor
router). When the gateway gives up -- its read timeout passed while the server was still
generating, or it could not reach the upstream -- the client gets the gateway's page: an
HTML "504 Gateway Time-out" from nginx, a JSON `litellm.Timeout` from LiteLLM, a plain
"upstream request timeout" from Envoy. llama-server itself answers JSON errors only, so
such a page says who answered: the gateway. It is a gateway failure, never by itself a
server crash or hang (triage/checks/server.py defers to this check); whether the server
behind it crashed is decided by replaying the request direct (the `gateway-direct` arm).

The reason names the gateway and, when the capture has it, how long the client waited: a
wait that ends on a round common default (30, 60, 120, 300, 600 s) is worth saying.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _pass, check

__all__ = ["GatewayPage", "check_gateway_error", "gateway_page", "register"]

KIND = "gateway-error"
# Statuses a gateway answers by itself: request timeout, bad gateway, unavailable, gateway
# timeout, and the CDN timeouts (Cloudflare 522/524).
GATEWAY_STATUSES = frozenset({408, 502, 503, 504, 522, 524})
MAX_TEXT = 4000  # only the head of a body is searched
# Round deadlines gateways and clients ship with (seconds), and how close counts (share).
COMMON_DEADLINES = (30.0, 60.0, 100.0, 120.0, 300.0, 600.0)
DEADLINE_TOLERANCE = 0.03

_NGINX = re.compile(r"<center>\s*nginx|<hr>\s*<center>\s*openresty|server:\s*nginx", re.I)
_HTML = re.compile(r"^\s*(?:<!doctype html|<html|<head|<body|<h1|<center)", re.I)
_TEXT_PAGE = re.compile(
    r"gateway time-?out|bad gateway|service unavailable|upstream request timeout"
    r"|upstream connect error|upstream timed out|no healthy upstream|error code: 52[24]",
    re.I,
)
_LITELLM = re.compile(r"\blitellm\.[A-Za-z]+", re.I)
# Statuses llama-server never answers itself (it sends 400/401/403/404/500/501/503): at these a
# JSON error is a gateway's own (a vendor router, Olla, a cloud load balancer), not the server's.
NOT_LLAMA_SERVER = frozenset({502, 504, 522, 524})
_JSON_GATEWAY = re.compile(
    r"gateway time-?out|bad gateway|upstream (?:request )?time(?:d)?[ -]?out|upstream connect"
    r"|no healthy upstream|timed out waiting|deadline exceeded",
    re.I,
)
# The triage proxy's own 502/504 (it records them as transport failures, not as a gateway).
_OWN_PROXY_TYPE = "upstream_error"


@dataclass(frozen=True)
class GatewayPage:
    """Who answered, and the text that says so."""

    gateway: str  # "nginx", "LiteLLM", "an HTML error page", ...
    evidence: str


def _head(view: View) -> str:
    if view.response_text:
        return view.response_text[:MAX_TEXT]
    if view.error is not None:
        return json.dumps(view.error, default=str)[:MAX_TEXT]
    return ""


def gateway_page(view: View) -> GatewayPage | None:
    """The gateway whose error page this answer is, or None (llama-server's own answer,
    or nothing that names a gateway)."""
    if view.status not in GATEWAY_STATUSES:
        return None
    text = _head(view)
    if not text:
        return None
    litellm = _LITELLM.search(text)
    if litellm:
        return GatewayPage("LiteLLM", litellm.group(0))
    if view.response is None and _HTML.search(text):
        nginx = _NGINX.search(text)
        if nginx:
            return GatewayPage("nginx", _title(text) or nginx.group(0).strip())
        return GatewayPage("an HTML error page (llama-server answers JSON)", _title(text) or "")
    if view.response is None:
        page = _TEXT_PAGE.search(text)
        if page:
            return GatewayPage("a gateway's plain-text page", page.group(0))
    elif view.status in NOT_LLAMA_SERVER and _error_type(view) != _OWN_PROXY_TYPE:
        said = _JSON_GATEWAY.search(text)
        if said:
            return GatewayPage(
                "a gateway's JSON error (llama-server never answers it)", said.group(0)
            )
    return None


def _error_type(view: View) -> str:
    for body in (view.error, view.response):
        if not isinstance(body, dict):
            continue
        inner = body.get("error")
        found = (inner if isinstance(inner, dict) else body).get("type")
        if found:
            return str(found)
    return ""


def _title(text: str) -> str:
    match = re.search(r"<title>([^<]{1,120})</title>|<h1>([^<]{1,120})</h1>", text, re.I)
    if match is None:
        return ""
    return (match.group(1) or match.group(2) or "").strip()


def _wait(view: View) -> str:
    if view.elapsed_ms is None or view.elapsed_ms <= 0:
        return ""
    seconds = view.elapsed_ms / 1000
    text = f" after {seconds:.1f} s"
    for deadline in COMMON_DEADLINES:
        if abs(seconds - deadline) <= deadline * DEADLINE_TOLERANCE:
            return f"{text} (a common {deadline:g} s gateway/client deadline)"
    return text


@check(KIND, number=22)
def check_gateway_error(view: View) -> list[Finding]:
    """A gateway (nginx, LiteLLM, ...) answered with its own error page."""
    page = gateway_page(view)
    if page is None:
        return _pass(KIND, "no gateway error page")
    evidence = f" ({page.evidence[:80]})" if page.evidence else ""
    return [
        Finding(
            KIND,
            False,
            0.9,
            f"HTTP {view.status} from {page.gateway}{evidence}{_wait(view)}: the gateway "
            "answered, not llama-server -- its deadline or its connection to the server "
            "failed; replaying direct to the server tells which",
            "$.response_text" if view.response_text else "$.error",
        )
    ]


CHECKS = (check_gateway_error,)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
