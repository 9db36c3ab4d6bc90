"""no-structured-output: the failing request without response_format / json_schema / grammar.

Planned only when the request asks for structured output. Together with thinking-off
(the other half of the conflict) it decides `structured-output`.
"""

from __future__ import annotations

import copy

from kb.jsontypes import JsonObject
from triage.checks.reasoning import structured_output_requested
from triage.plugin_api import Registry
from triage.probes import RequestArm

ID = "no-structured-output"


def without_structured_output(request: JsonObject) -> JsonObject:
    """The request with its structured-output constraint removed (plain text answer)."""
    body = copy.deepcopy(request)
    for key in ("grammar", "json_schema"):
        body.pop(key, None)
    response_format = body.get("response_format")
    if isinstance(response_format, dict) and response_format.get("type") in (
        "json_object",
        "json_schema",
    ):
        body.pop("response_format")
    return body


ARM = RequestArm(
    ID,
    "response_format / json_schema / grammar removed",
    without_structured_output,
    ("structured-output",),
    order=50,
    applies=lambda request: structured_output_requested(request) is not None,
    precondition="response_format / json_schema / grammar in the request",
)


def register(catalogue: Registry) -> None:
    catalogue.arms.add(ARM)
