"""stream-format: the answer was right, its streamed deltas broke the OpenAI chunk format --
a tool call's first delta without id/type/name, an index that jumps or changes, the name
resent in later deltas (a client that concatenates shows "get_weatherget_weather"),
arguments that do not concatenate to JSON -- while the same request with `stream: false` is
well formed. Whoever rewrote the deltas (a server build, a gateway translating the stream)
is named when the stack shows it.

Decided by the `stream-vs-nonstream` observation (triage/engine/arms/stream_format.py), not
by the scheduler's baseline: the baseline is never streamed, so a failure in the stream's
format cannot reproduce there. The reproduction gate is the streamed replays themselves:

  confirmed  the streamed replays reproduce the violation (at least the baseline rule's
             share, never one sample) and the non-streamed replies of the same seeds remove
             it (the engine's sequential rule on the pairs);
  rejected   the client did not stream; or the captured stream is well formed (no
             violation: the format did not break what the client saw); or the non-streamed
             replies fail as often (the failure is not the stream's format);
  suspected  the streamed replays do not reproduce the violation (untested), the
             observation did not run, or the pairs are undecided at the cap.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triage.causes import ArmOutcome, CauseRule, Observations, Verdict, suspect
from triage.engine.arms.stream_format import ARM
from triage.stats import baseline_reproduces, wilson

ID = "stream-format"


def _kn(k: int, n: int) -> str:
    ci = wilson(k, n)
    return f"{k}/{n} (95% CI {ci.low:.2f}-{ci.high:.2f})"


def _rejected(why: str, deciding: str = ARM) -> Verdict:
    return Verdict(ID, "rejected", why, refutes=[deciding], deciding_probe=deciding)


def _where(facts: Mapping[str, Any]) -> str:
    direct = facts.get("direct")
    if not isinstance(direct, dict) or not direct.get("n"):
        return ""
    streamed = _kn(int(direct.get("failures") or 0), int(direct["n"]))
    if direct.get("failures"):
        return (
            f"; streamed direct to llama-server they break it too ({streamed}): the server "
            "itself sends the malformed deltas"
        )
    return (
        f"; streamed direct to llama-server {streamed} break it: the gateway in front "
        "rewrites the deltas"
    )


def _codes(pairs: Mapping[str, Any]) -> str:
    codes = pairs.get("codes") or {}
    return ", ".join(f"{code} in {count}" for code, count in codes.items()) or "violations"


def _pairs_verdict(facts: Mapping[str, Any]) -> Verdict:
    pairs = facts.get("pairs") or {}
    n = int(pairs.get("n") or 0)
    if n == 0:
        return suspect(
            ID,
            f"no streamed replay was answered ({pairs.get('errors', 0)} errors)",
            ARM,
            basis="untested",
        )
    streamed_k, plain_k = (
        int(pairs.get("stream_failures") or 0),
        int(pairs.get("nonstream_failures") or 0),
    )
    streamed, plain = _kn(streamed_k, n), _kn(plain_k, n)
    if not baseline_reproduces(streamed_k, n):
        return suspect(
            ID,
            f"the captured stream breaks the chunk format, but the streamed replays do not "
            f"reproduce it: {streamed} with a violation; nothing can be attributed until "
            "they do (a server or gateway that changed since, or a stream the capture "
            "altered)",
            f"{ARM} on the stack the client used",
            basis="untested",
        )
    decision = pairs.get("decision")
    if decision == "unchanged":
        kinds = ", ".join(pairs.get("nonstream_kinds") or {}) or "a failure"
        return _rejected(
            f"the streamed replies break the chunk format ({streamed}), but the same requests "
            f"with stream:false fail as often ({plain}: {kinds}): the answer itself is wrong, "
            "not only its stream"
        )
    if decision != "removes":
        return suspect(
            ID,
            f"undecided at the cap: streamed {streamed} vs stream:false {plain}",
            f"{ARM} with more pairs",
        )
    p = pairs.get("p_value")
    same = int(pairs.get("same_answer") or 0)
    return Verdict(
        ID,
        "confirmed",
        f"the streamed replies break the OpenAI chunk format ({_codes(pairs)} of {n} "
        f"streams): streamed {streamed} vs the same requests with stream:false {plain}"
        + (f" (p={p:.2g})" if isinstance(p, (int, float)) else "")
        + f"; in {same}/{n} pairs the stream, re-assembled leniently, carries the same answer"
        + _where(facts),
        supports=[ARM],
        deciding_probe=ARM,
    )


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    facts = obs.facts.get(ARM)
    if not facts or facts.get("error"):
        why = (facts or {}).get("error") or f"the {ARM} observation did not run"
        return suspect(ID, str(why), ARM, basis="untested")
    if facts.get("streamed") is False:
        return _rejected(
            "the client did not stream the request (no stream: true): its reply was one "
            "JSON document, with no delta to break",
            "request",
        )
    captured = facts.get("captured_violations")
    if captured == 0:
        return _rejected(
            "the captured stream is well formed: every delta follows the OpenAI chunk "
            "format (0 stream-format violations), so the format did not break what the "
            "client saw"
        )
    return _pairs_verdict(facts)


CAUSE = CauseRule(
    id=ID,
    number=22,
    title="Stream format (streamed deltas break the OpenAI chunk format)",
    mechanism="the streamed chunks of an otherwise right answer break the OpenAI format: a "
    "tool call's first delta without id/type/name, an index that jumps or changes, the name "
    "resent in later deltas, arguments that do not concatenate to JSON; a strict client "
    "shows a broken or lost tool call, while the same request with stream:false is well "
    "formed",
    decided_by=f"the {ARM} observation (streamed replies validated per delta vs stream:false, "
    "paired seeds), when the client streamed",
    rule=rule,
    retrospective="the answer was right, but its streamed deltas broke the OpenAI chunk "
    "format (a strict client lost or garbled the tool call); the same request without "
    "streaming was well formed",
)


def register(catalogue: Any) -> None:
    catalogue.causes.add(CAUSE)
