"""Built-in check `server-flag-error`: llama-server refused the request because of how it
was launched -- "tools param requires --jinja flag" (a `--no-jinja` server asked for tools),
"this custom template is not supported, try using --jinja". The request is fine; the
server's flags cannot serve it (the `server-flags` cause; its `jinja-on` arm decides it).
"""

from __future__ import annotations

import json

from triage.catalogue import Catalogue
from triage.checks.base import Finding, View, _pass, check
from triage.llama.flags import flag_error_line

KIND = "server-flag-error"
MAX_TEXT = 4000


@check(KIND, number=23)
def check_server_flag_error(view: View) -> list[Finding]:
    """The server refused the request for want of a launch flag (e.g. --jinja)."""
    if view.status is not None and view.status < 400 and view.error is None:
        return _pass(KIND, "the server accepted the request")
    texts = []
    if view.error is not None:
        texts.append(("$.error.message", json.dumps(view.error, default=str)[:MAX_TEXT]))
    if view.response_text:
        texts.append(("$.response_text", view.response_text[:MAX_TEXT]))
    for where, text in texts:
        line = flag_error_line(text)
        if line:
            status = f"HTTP {view.status}: " if view.status else ""
            return [
                Finding(
                    KIND,
                    False,
                    1.0,
                    f"{status}the server refused the request for its launch flags: {line!r}",
                    where,
                )
            ]
    return _pass(KIND, "no launch-flag refusal")


CHECKS = (check_server_flag_error,)


def register(catalogue: Catalogue) -> None:
    """Entry point: add this module's checks to the catalogue."""
    for item in CHECKS:
        catalogue.checks.add(item)
