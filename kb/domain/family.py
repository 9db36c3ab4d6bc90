"""Failure families (pure): stack/exchange signatures and their similarity.

A signature is what "have we seen this before?" compares:

    finding kinds     the failed checks of an exchange / an incident's symptom kinds
    confirmed causes  catalogue ids of causes with status `confirmed`
    fingerprint       model family (gemma, qwen, llama, ... from the model or weights name),
                      server build number, speculative decoding on/off, thinking default
                      on/off

Similarity is a weighted Jaccard index over the signature's elements (each kind, each
confirmed cause, and one element per known fingerprint field such as `family=qwen`):

    similarity(Q, P) = sum of weights of elements in both / sum of weights in either

with the weights in WEIGHTS (a confirmed cause counts double a finding kind, a shared
thinking default as much as a kind, model family, speculative decoding and build less).
A dimension the query does not know (no findings, no causes, unknown fingerprint field)
is left out of the comparison on both sides. Unknowns on the past incident's side still
count in the union: it explains less of what we know now. A fresh capture has no
confirmed causes yet; until it has, the causes its findings name directly stand in for
them (IMPLIED_CAUSES: a `reasoning-exhausted-budget` finding *is* the observation of the
`reasoning-exhausts-budget` mechanism), so a capture matches past incidents by mechanism
even when their recorded symptoms use other words.

The stored signatures, the SQL ranking and family links are in kb.repo.family.
Every incident has one compact row in `incidentsignature` (created by migration
0002_search): bit masks of the known kinds and causes, the texts of all of them, counts
and the fingerprint fields. Triggers mark the row stale whenever the incident's stack,
symptoms or causes change; `refresh_signatures` recomputes stale rows (the write paths of
this module and the `triage family` command call it). `similar_incidents` scores fresh
rows in one SQL statement (a scan of 100k narrow rows with bit tests) and stale rows in
Python with the same formula, so results never depend on whether a refresh has run.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from kb.domain import flags
from kb.jsontypes import JsonObject
from kb.vocab import BUILD_KEYS

__all__ = [
    "FINGERPRINT_FIELDS",
    "IMPLIED_CAUSES",
    "MODEL_FAMILIES",
    "WEIGHTS",
    "FamilyMatch",
    "Signature",
    "elements",
    "signature",
    "similarity",
    "stack_fingerprint",
]

# Finding kinds that are direct observations of one catalogue cause (see module docstring).
IMPLIED_CAUSES = {
    "reasoning-exhausted-budget": "reasoning-exhausts-budget",
    "parse-failure": "output-parsing",
    "tool-markup-leaked": "output-parsing",
    # Issue 13: findings that name their mechanism (markup of the thought in content is the
    # leak; a client view that lost what the wire carried is the client's handling).
    "reasoning-markup-in-content": "reasoning-leak",
    "client-lost-reply": "client-handling",
}

# Relative weights, integers so that SQL sums them exactly and cheaply (only the final
# division is in floating point): a finding kind 4, a confirmed cause 8, a shared thinking
# default 4, model family 2, speculative decoding 2, server build 1.
WEIGHTS = {
    "kind": 4,
    "cause": 8,
    "model_family": 2,
    "server_build": 1,
    "spec": 2,
    "thinking": 4,
}
FINGERPRINT_FIELDS = ("model_family", "server_build", "spec", "thinking")

# Looked for in the file name of the model/weights, at a word start; "llama" only when no
# other family is named (it matches inside words: codellama, tinyllama).
MODEL_FAMILIES = (
    "gemma",
    "qwen",
    "mixtral",
    "mistral",
    "ministral",
    "deepseek",
    "phi",
    "gpt-oss",
    "glm",
    "granite",
    "command-r",
    "falcon",
    "olmo",
    "smollm",
    "internlm",
    "minicpm",
    "exaone",
    "hunyuan",
    "kimi",
    "yi",
    "llama",
)
_FAMILY_PATTERNS = [
    (name, re.compile(("" if name == "llama" else r"(?<![a-z])") + re.escape(name)))
    for name in MODEL_FAMILIES
]
# Stack keys read for each fingerprint field, in order of preference.
_MODEL_KEYS = ("model", "weights", "model_path", "model_name")
_BUILD_KEYS = BUILD_KEYS
_SPEC_KEYS = ("speculative", "spec", "speculative_decoding")
_THINKING_KEYS = ("thinking_default", "thinking", "enable_thinking")
_ON = {"on", "true", "yes", "1", "enabled", "enable"}
_OFF = {"off", "false", "no", "0", "none", "disabled", "disable"}
_UNKNOWN = {"", "not", "unknown", "n", "na", "unrecorded", "null"}


@dataclass(frozen=True)
class Signature:
    """Finding kinds, confirmed causes and the stack fingerprint of an exchange or incident."""

    kinds: frozenset[str] = frozenset()
    causes: frozenset[str] = frozenset()
    model_family: str = ""
    server_build: str = ""
    spec: str = ""  # "on" | "off" | "" (unknown)
    thinking: str = ""  # "on" | "off" | "" (unknown)

    def fingerprint(self) -> dict[str, str]:
        return {name: getattr(self, name) for name in FINGERPRINT_FIELDS}

    def compared_causes(self) -> frozenset[str]:
        """The causes compared when this is the query: confirmed, else implied by findings."""
        if self.causes:
            return self.causes
        return frozenset(IMPLIED_CAUSES[kind] for kind in self.kinds if kind in IMPLIED_CAUSES)

    def to_dict(self) -> JsonObject:
        return {
            "kinds": sorted(self.kinds),
            "causes": sorted(self.causes),
            **self.fingerprint(),
        }


@dataclass(frozen=True)
class FamilyMatch:
    """A past incident similar to the query signature, with what they share."""

    slug: str
    title: str
    status: str
    score: float
    shared_kinds: list[str] = field(default_factory=list)
    shared_causes: list[str] = field(default_factory=list)
    shared_stack: list[str] = field(default_factory=list)  # e.g. ["spec=off", "thinking=on"]
    confirmed_causes: list[str] = field(default_factory=list)
    model_family: str = ""
    linked: bool = False  # a FamilyLink already joins a cause of each incident

    def to_dict(self) -> JsonObject:
        return asdict(self)


# ------------------------------------------------------------------ signatures (pure)


def _switch(value: Any) -> str:
    """The switch as on/off/"" (unknown) from a bool or a word; other words (a spec type) are on."""
    if value is None or value == "":
        return ""
    if isinstance(value, bool):
        return "on" if value else "off"
    # Free text is read by its first word: "on: the template enables thinking" is on,
    # "draft-MTP speculative decoding" is on, "not recorded" is unknown.
    first = re.match(r"\s*([a-z0-9]*)", str(value).lower())
    word = first.group(1) if first else ""
    if word in _UNKNOWN:
        return ""
    if word in _OFF:
        return "off"
    return "on"


def _args(stack: Mapping[str, Any]) -> list[str] | None:
    """Server arguments from `flags` or `args` (a list or one shell string); None if absent."""
    found: list[str] | None = None
    for key in ("flags", "args"):
        value = stack.get(key)
        if value is None:
            continue
        found = found or []
        if isinstance(value, str):
            try:
                found.extend(shlex.split(value))
            except ValueError:
                found.extend(value.split())
        else:
            found.extend(str(item) for item in value)
    return found


def _flag_value(args: Sequence[str], *names: str) -> str | None:
    """The value of the last `--name VALUE` or `--name=VALUE` among `args`."""
    value: str | None = None
    for index, arg in enumerate(args):
        for name in names:
            if arg == name:
                value = args[index + 1] if index + 1 < len(args) else ""
            elif arg.startswith(name + "="):
                value = arg.split("=", 1)[1]
    return value


def model_family(*names: str) -> str:
    """The model family in the first name that has one (file names and model ids)."""
    for name in names:
        base = os.path.basename(str(name or "").rstrip("/")).lower()
        if not base:
            continue
        # The family named first wins ("deepseek-r1-distill-qwen" is deepseek).
        found = [
            (match.start(), family)
            for family, pattern in _FAMILY_PATTERNS
            if family != "llama" and (match := pattern.search(base))
        ]
        if found:
            return min(found)[1]
        if "llama" in base:
            return "llama"
    return ""


def server_build(value: Any) -> str:
    """A build number ("b9586", "9586 (abc)", "llama.cpp b11434") as digits, else the text."""
    text = str(value or "").strip().lower()
    if not text:
        return ""
    number = re.search(r"(?<![0-9a-f])b?(\d{3,})", text)
    return number.group(1) if number else text[:50]


def stack_fingerprint(stack: Mapping[str, Any]) -> dict[str, str]:
    """Model family, build, spec on/off and thinking default from a stack dict.

    Keys read: `model_family` or the file names in model/weights/model_path/model_name;
    server_build/build/build_info/system_fingerprint (or `b<digits>` in the binary path);
    speculative/spec (bool or word) else the server flags (`flags` or `args`:
    --spec-type other than none, -md, --model-draft); thinking_default/thinking/
    enable_thinking (bool or word) else the flags (--reasoning on|off, --reasoning-budget 0,
    --chat-template-kwargs with enable_thinking). Unknown fields are "".
    """
    family = str(stack.get("model_family") or "").strip().lower()
    if not family:
        family = model_family(*(str(stack.get(key) or "") for key in _MODEL_KEYS))

    build = ""
    for key in _BUILD_KEYS:
        build = server_build(stack.get(key))
        if build:
            break
    if not build and stack.get("binary"):
        match = re.search(r"(?:^|[^a-z0-9])b(\d{3,})", str(stack["binary"]).lower())
        build = match.group(1) if match else ""

    args = _args(stack)
    spec = next((_switch(stack.get(key)) for key in _SPEC_KEYS if key in stack), "")
    if not spec and args:  # no flags recorded is unknown, not "off"
        spec_type = _flag_value(args, "--spec-type")
        # A draft model turns it on; so does a --spec-type other than none.
        on = any(arg.split("=", 1)[0] in flags.DRAFT_MODEL_FLAGS for arg in args)
        if spec_type is not None and spec_type.strip().lower() not in _OFF:
            on = True
        spec = "on" if on else "off"

    thinking = next((_switch(stack.get(key)) for key in _THINKING_KEYS if key in stack), "")
    if not thinking and args:
        reasoning = _flag_value(args, "--reasoning")
        budget = _flag_value(args, "--reasoning-budget")
        kwargs = _flag_value(args, "--chat-template-kwargs") or ""
        kwargs_thinking = re.search(r'"enable_thinking"\s*:\s*(true|false)', kwargs)
        if kwargs_thinking:
            thinking = "on" if kwargs_thinking.group(1) == "true" else "off"
        elif reasoning is not None and reasoning.strip().lower() in _OFF | _ON:
            thinking = _switch(reasoning)
        elif budget is not None and budget.strip() == "0":
            thinking = "off"
    return {"model_family": family, "server_build": build, "spec": spec, "thinking": thinking}


def signature(
    finding_kinds: Iterable[str], confirmed_causes: Iterable[str], stack: Mapping[str, Any]
) -> Signature:
    """The signature of an exchange or incident (see `stack_fingerprint` for `stack`)."""
    return Signature(
        kinds=frozenset(k.strip() for k in finding_kinds if k and k.strip()),
        causes=frozenset(c.strip() for c in confirmed_causes if c and c.strip()),
        **stack_fingerprint(stack),
    )


def elements(sig: Signature, *, as_query: bool = False) -> dict[str, int]:
    causes = sig.compared_causes() if as_query else sig.causes
    elements = {f"kind:{kind}": WEIGHTS["kind"] for kind in sig.kinds}
    elements.update({f"cause:{cause}": WEIGHTS["cause"] for cause in causes})
    for name, value in sig.fingerprint().items():
        if value:
            elements[f"{name}={value}"] = WEIGHTS[name]
    return elements


def _compared(query: Signature) -> set[str]:
    dims = {name for name, value in query.fingerprint().items() if value}
    if query.kinds:
        dims.add("kinds")
    if query.compared_causes():
        dims.add("causes")
    return dims


def _dimension(element: str) -> str:
    if element.startswith("kind:"):
        return "kinds"
    if element.startswith("cause:"):
        return "causes"
    return element.split("=", 1)[0]


def similarity(query: Signature, past: Signature) -> float:
    """Weighted Jaccard of two signatures over the dimensions the query knows (see module)."""
    dims = _compared(query)
    mine = elements(query, as_query=True)
    theirs = {e: w for e, w in elements(past).items() if _dimension(e) in dims}
    shared = sum(weight for element, weight in mine.items() if element in theirs)
    union = sum(mine.values()) + sum(theirs.values()) - shared
    return shared / union if union > 0 else 0.0
