"""Request-field ablation (issue 23): the captured request replayed with ONE of its fields
neutralised -- `without-stop`, `without-sampling`, `without-penalties`, ... -- to name the
field whose removal removes the failure even when no catalogue cause knows the mechanism.

Each group of fields present in the request is one arm (a group absent from the request is
not planned). The arms decide no cause; the diagnosis's UNEXPLAINED verdict names the
fields whose removal removed the failure (`request_fields`). They cost replays that a
diagnosis which found its cause does not need, so they are held back (`when =
"unexplained"`): the engine runs them only after every other arm, when the baseline
reproduced and no cause is confirmed -- with the same sequential statistics against the
same baseline as every other arm, after the same reproduction gate.

Neutralising means removing: the server's own default takes the field's place (the system
message is dropped; the template kwargs go back to the template's defaults). `max_tokens`
and the thinking switch are not here: token-limit-lifted and the thinking arms probe them.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kb.jsontypes import JsonObject
from triage.plugin_api import Registry
from triage.probes import PlannedArm
from triage.stackfile import Stack

__all__ = ["FAMILY", "GROUPS", "HELD_BACK", "FieldAblation", "FieldGroup", "register"]

FAMILY = "request-field-ablation"
HELD_BACK = "unexplained"  # PlannedArm.when: run only when nothing else explains the failure
PRECONDITION = "the request sets the field; runs only when no cause is confirmed"
SYSTEM_ROLES = ("system", "developer")


@dataclass(frozen=True)
class FieldGroup:
    """Fields neutralised together: one knob the client set (the sampling parameters)."""

    name: str
    fields: tuple[str, ...]
    order: int


GROUPS: tuple[FieldGroup, ...] = (
    FieldGroup("stop", ("stop", "stop_sequences"), 0),
    FieldGroup(
        "sampling",
        (
            "temperature",
            "top_p",
            "top_k",
            "min_p",
            "typical_p",
            "tfs_z",
            "top_n_sigma",
            "dynatemp_range",
            "dynatemp_exponent",
            "xtc_probability",
            "xtc_threshold",
            "mirostat",
            "mirostat_tau",
            "mirostat_eta",
            "samplers",
        ),
        1,
    ),
    FieldGroup(
        "penalties",
        (
            "repeat_penalty",
            "repeat_last_n",
            "presence_penalty",
            "frequency_penalty",
            "penalty_last_n",
            "dry_multiplier",
            "dry_base",
            "dry_allowed_length",
            "dry_penalty_last_n",
            "dry_sequence_breakers",
        ),
        2,
    ),
    FieldGroup("logit-bias", ("logit_bias",), 3),
    FieldGroup("structured-output", ("response_format", "grammar", "json_schema"), 4),
    FieldGroup("tools", ("tools", "tool_choice", "parallel_tool_calls", "functions"), 5),
    FieldGroup("template-kwargs", ("chat_template_kwargs",), 6),
    FieldGroup("reasoning-fields", ("reasoning_format", "reasoning_effort"), 7),
    FieldGroup("logprobs", ("logprobs", "top_logprobs", "n_probs"), 8),
    FieldGroup("system-message", (), 9),  # the messages whose role is system / developer
)


def _system_messages(request: JsonObject) -> int:
    messages = request.get("messages")
    if not isinstance(messages, list):
        return 0
    return sum(1 for m in messages if isinstance(m, dict) and m.get("role") in SYSTEM_ROLES)


def present(group: FieldGroup, request: JsonObject) -> list[str]:
    """The group's fields the request sets (for the system message: its role(s))."""
    if group.name == "system-message":
        return ["messages[role=system]"] if _system_messages(request) else []
    return [f for f in group.fields if f in request and request[f] is not None]


def _without(group: FieldGroup) -> Callable[[JsonObject], JsonObject]:
    def transform(request: JsonObject) -> JsonObject:
        body = copy.deepcopy(request)
        if group.name == "system-message":
            messages = body.get("messages")
            if isinstance(messages, list):
                body["messages"] = [
                    m
                    for m in messages
                    if not (isinstance(m, dict) and m.get("role") in SYSTEM_ROLES)
                ] or messages
            return body
        for name in group.fields:
            body.pop(name, None)
        return body

    return transform


@dataclass(frozen=True)
class FieldAblation:
    """One ablation arm: the request with `group`'s fields removed."""

    group: FieldGroup
    level: str = "request"
    family: str = FAMILY
    precondition: str = PRECONDITION

    @property
    def id(self) -> str:
        return f"without-{self.group.name}"

    @property
    def order(self) -> int:
        return 80 + self.group.order  # after every catalogue request arm

    def plan(self, stack: Stack, request: JsonObject) -> PlannedArm | None:
        fields = present(self.group, request)
        if not fields:
            return None
        if self.group.name == "system-message" and _system_messages(request) == len(
            request.get("messages") or []
        ):
            return None  # nothing would be left to send
        shown = ", ".join(
            f"{f}={json_short(request.get(f))}" if f in request else f for f in fields
        )
        return PlannedArm(
            self.id,
            f"without {shown} (request-field ablation)",
            self.level,
            (),
            _without(self.group),
            when=HELD_BACK,
        )


def json_short(value: Any, limit: int = 40) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


ARMS = tuple(FieldAblation(group) for group in GROUPS)


def register(catalogue: Registry) -> None:
    for arm in ARMS:
        catalogue.arms.add(arm)
