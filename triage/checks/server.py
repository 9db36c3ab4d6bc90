"""Built-in checks on the server behind a captured exchange: server-crash, server-hang.

A captured transport failure is a crash or a hang of the server as the client saw it: a
proxy's 502 (the upstream died or reset the connection), a reset / closed connection, or a
proxy's 504 (the upstream stopped answering) -- unless the answer is a gateway's own error
page (nginx's HTML, LiteLLM's JSON): that is the `gateway-error` finding, a gateway failure
that says nothing yet about the server behind it (triage/checks/gateway.py). The engine's
replays carry the same kinds when their own server crashed mid-request or hung
(triage/engine/crashes.py), so such a capture is reproduced only by a replay whose server
crashed (or hung) too -- or, for a gateway's page, by a replay through the gateway.
"""

from __future__ import annotations

import json
import re

from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _pass, check
from triage.checks.gateway import gateway_page

_CRASH_TEXT = re.compile(
    r"connection reset|reset by peer|upstream prematurely closed|server disconnected"
    r"|remote end closed connection|remoteprotocolerror|broken pipe|bad gateway"
    r"|empty reply from server|connection (?:was )?(?:closed|aborted)",
    re.IGNORECASE,
)
_HANG_TEXT = re.compile(r"gateway time-?out|upstream timed out", re.IGNORECASE)
MAX_TEXT = 4000  # only the head of an error body is searched


def _error_text(view: View) -> str:
    parts = []
    if view.error is not None:
        parts.append(json.dumps(view.error, default=str)[:MAX_TEXT])
    if view.response is None and view.response_text:
        parts.append(view.response_text[:MAX_TEXT])
    return "\n".join(parts)


@check("server-crash", number=11)
def check_server_crash(view: View) -> list[Finding]:
    """The server died under the request: a proxy's 502, or a reset / closed connection."""
    kind = "server-crash"
    page = gateway_page(view)
    if page is not None:
        return _pass(kind, f"HTTP {view.status} is {page.gateway}'s page: a gateway failure")
    if view.status == 502:
        return [
            Finding(
                kind,
                False,
                0.9,
                "HTTP 502: the upstream server failed (crashed or reset the connection)",
                "$.status",
            )
        ]
    text = _error_text(view)
    match = (
        _CRASH_TEXT.search(text) if text and (view.status is None or view.status >= 500) else None
    )
    if match:
        return [
            Finding(
                kind,
                False,
                0.8,
                f"the connection to the server broke: {match.group(0)!r}",
                "$.error" if view.error else "$.response_text",
                match.start(),
            )
        ]
    return _pass(kind, "no sign of a server crash")


@check("server-hang", number=12)
def check_server_hang(view: View) -> list[Finding]:
    """The server stopped answering: a proxy's 504 gateway timeout."""
    kind = "server-hang"
    page = gateway_page(view)
    if page is not None:
        return _pass(kind, f"HTTP {view.status} is {page.gateway}'s page: a gateway failure")
    if view.status == 504:
        return [
            Finding(
                kind,
                False,
                0.8,
                "HTTP 504: the upstream server did not answer in time (hung or overloaded)",
                "$.status",
            )
        ]
    text = _error_text(view)
    match = _HANG_TEXT.search(text) if text else None
    if match:
        return [
            Finding(
                kind,
                False,
                0.7,
                f"the proxy gave up on the server: {match.group(0)!r}",
                "$.error" if view.error else "$.response_text",
                match.start(),
            )
        ]
    return _pass(kind, "no sign of a server hang")


CHECKS = (check_server_crash, check_server_hang)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
