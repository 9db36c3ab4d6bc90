"""Which live failures are one problem, and which are what the client asked for (pure).

Grouping, like an error tracker's: one incident per *problem* -- the model, the request's
shape and the primary symptom (with the status class) -- and the exact symptom sets seen
for it ("variants", e.g. `empty-content+length-stop+reasoning-exhausted-budget|2xx` and
`length-stop+reasoning-exhausted-budget|2xx`) are sub-signatures recorded on that one
incident. The primary symptom is the most specific failing kind: the one the others follow
from (a thinking channel that used the budget up explains the empty content and the length
stop, not the reverse).

Request shape: what a client's code path fixes about its requests and what changes what
the server does with them -- the endpoint, streaming, tools, a response format / grammar,
and whether the request sets a stop list or a token limit. Not the prompt, not the values.

Client-configured behaviour: a reply that did exactly what the request asked is recorded
and shown but is no incident by default (`OpeningRules.open_on_client_limits`):

- it stopped at the client's own `max_tokens` and nothing else failed (the truncation the
  client asked for), or the limit is tiny (<= TINY_MAX_TOKENS: no answer fits, so what a
  cut reply shows -- empty content, a thought or tool call left open, JSON cut short --
  follows from the limit, not from the server);
- the client sent a stop list, the reply ended on a stop (not on the length limit) and the
  only failure is empty content: a stop string matched before any content.

Minimum comparison window: an incident opens only once at least `min_exchanges` exchanges
of the problem's model and shape were seen (current and trailing windows together), so a
handful of requests against nothing to compare with ("trailing 0/0") opens nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from triage.proxy.rates import signature_kinds

# Smallest max_tokens that leaves room for an answer: at or below it, an empty or
# reasoning-only reply that hit the limit is the limit's doing.
TINY_MAX_TOKENS = 16
# Exchanges of one model and shape that must be on record before an incident opens.
MIN_EXCHANGES = 10
LENGTH_FINISH = ("length", "max_tokens")
# What a reply cut after a few tokens shows: no content, a thought or a tool call left open
# (its markup in content), arguments or a JSON answer cut short. Below TINY_MAX_TOKENS these
# follow from the client's limit (on the real drill server, max_tokens 2 gives
# `length-stop+reasoning-markup-in-content`); server-level kinds (errors, timeouts,
# crashes, mojibake) never do.
CUT_KINDS = frozenset(
    {
        "length-stop",
        "empty-content",
        "reasoning-exhausted-budget",
        "reasoning-markup-in-content",
        "tool-markup-leaked",
        "tool-args-invalid-json",
        "tool-args-schema-violation",
        "structured-output-failed",
    }
)

# Most specific first: a kind earlier in this list explains the later ones when both fail.
# Kinds not listed (a plugin's) rank after the listed specific kinds and before the
# generic consequences (empty content, a length stop).
_SPECIFIC = (
    "server-crash",
    "server-hang",
    "timeout",
    "http-error",
    "parse-failure",
    "truncated-stream",
    "reasoning-exhausted-budget",
    "repetition-to-context-end",
    "tool-args-invalid-json",
    "tool-args-schema-violation",
    "tool-markup-leaked",
    "structured-output-failed",
    "reasoning-markup-in-content",
    "mojibake",
    "client-lost-reply",
)
_GENERIC = ("empty-content", "length-stop")


@dataclass(frozen=True)
class OpeningRules:
    """When the proxy opens an incident (picklable: it crosses into the recorder process)."""

    open_on_client_limits: bool = False
    min_exchanges: int = MIN_EXCHANGES

    def __post_init__(self) -> None:
        if self.min_exchanges < 1:
            raise ValueError("the minimum comparison window must be at least 1 exchange")


def _rank(kind: str) -> tuple[int, int, str]:
    if kind in _SPECIFIC:
        return (0, _SPECIFIC.index(kind), kind)
    if kind in _GENERIC:
        return (2, _GENERIC.index(kind), kind)
    return (1, 0, kind)


def primary_symptom(kinds: Iterable[str]) -> str:
    """The most specific failing kind ("" for none)."""
    ranked = sorted({k for k in kinds if k}, key=_rank)
    return ranked[0] if ranked else ""


def group_of(signature: str) -> str:
    """`primary|class` of a failure signature `kind+kind|class` ("" for a working one)."""
    if not signature:
        return ""
    _, _, status = signature.partition("|")
    return f"{primary_symptom(signature_kinds(signature))}|{status}"


def problem_key(group: str, shape: str) -> str:
    """The problem an incident tracks within a model: primary symptom, class and shape."""
    return f"{group}@{shape}"


def _nonempty(value: Any) -> bool:
    return value not in (None, "", [], {}, False)


def _max_tokens(request: Mapping[str, Any]) -> int | None:
    for key in ("max_completion_tokens", "max_tokens", "n_predict"):
        value = request.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if value > 0 and float(value).is_integer():
            return int(value)
    return None


def request_shape(path: str, request: Any, *, stream: bool) -> str:
    """A short stable name of the request's shape, e.g. `chat.stream.tools.max_tokens`."""
    endpoint = path.rstrip("/").rsplit("/", 1)[-1] or "root"
    if endpoint == "completions" and "/chat/" in path:
        endpoint = "chat"
    parts = [endpoint[:30], "stream" if stream else "json"]
    if isinstance(request, Mapping):
        if _nonempty(request.get("tools")) or _nonempty(request.get("functions")):
            parts.append("tools")
        fmt = request.get("response_format")
        if isinstance(fmt, Mapping) and str(fmt.get("type") or "") not in ("", "text"):
            parts.append("format")
        elif _nonempty(request.get("grammar")) or _nonempty(request.get("json_schema")):
            parts.append("format")
        if _nonempty(request.get("stop")):
            parts.append("stop")
        if _max_tokens(request) is not None:
            parts.append("max_tokens")
    return ".".join(parts)


def _finish_reasons(response: Any) -> list[str]:
    if not isinstance(response, Mapping):
        return []
    choices = response.get("choices")
    if not isinstance(choices, list):
        return []
    return [
        str(choice.get("finish_reason") or "") for choice in choices if isinstance(choice, Mapping)
    ]


def client_limit(request: Any, response: Any, kinds: Iterable[str]) -> str:
    """Why the failure is what the client configured ("" when it is not): see the module
    docstring. `request` and `response` are the (redacted) exchange's JSON objects."""
    failing = set(kinds)
    if not failing or not isinstance(request, Mapping):
        return ""
    reasons = _finish_reasons(response)
    limit = _max_tokens(request)
    if limit is not None and reasons and all(r in LENGTH_FINISH for r in reasons):
        if failing == {"length-stop"}:
            return f"the reply stopped at the client's max_tokens {limit}"
        if limit <= TINY_MAX_TOKENS and failing <= CUT_KINDS:
            return f"the client's max_tokens {limit} leaves no room for an answer"
    if (
        _nonempty(request.get("stop"))
        and failing == {"empty-content"}
        and reasons
        and all(r == "stop" for r in reasons)
    ):
        return "the client's stop list ended the reply before any content"
    return ""
