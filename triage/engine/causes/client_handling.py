"""client-handling: the server's answer was fine, the client lost it -- a client that keeps
only `content` (tool calls and reasoning dropped from a stream), or a "thinking off" that
never reached the wire.

Two ways to confirm, and what each takes:

* A thinking-off the client sent where llama-server does not read it (`dropped_flags` of
  the `client-view` observation: evidence from the captured request, not a probe result):
  confirmed when the baseline reproduces the failure and the `thinking-off` arm (the flag
  where the server reads it) removes it significantly -- the usual removal rule.
* A capture that holds both the raw stream on the wire and the client's view of it (format
  `client-view`). Here the server NOT reproducing the failure is the evidence, so the
  reproduction gate is replaced by three conditions, all required: (1) the capture is
  internally consistent -- the wire answer, re-assembled by triage, passes the symptom
  checks, the client's view fails them, and a documented client signature turns one into
  the other; (2) the server's streamed answers, re-assembled by triage, remove the failure
  significantly against the same streams seen through that signature (paired seeds, the
  engine's sequential rule, never from one sample); (3) the non-streamed baseline does not
  reproduce it either (at least 8 replays, 95% interval including 0).

Rejected when the server's own answer shows the failure: the wire answer of a client-view
capture fails, or (no client evidence) the baseline reproduces the failure and sending
thinking-off where the server reads it changes nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import cast

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    arm_gate,
    baseline_of,
    removal_verdict,
    reproduces,
    suspect,
    unchanged,
)
from triage.engine.arms.client_view import ClientViewFacts, StreamedReplays
from triage.plugin_api import Registry
from triage.stats import wilson

ID = "client-handling"
OBSERVATION = "client-view"
THINKING_OFF = "thinking-off"
MIN_BASELINE = 8  # non-streamed replays that must all come back without the failure


def _kn(k: int, n: int) -> str:
    ci = wilson(k, n)
    return f"{k}/{n} (95% CI {ci.low:.2f}-{ci.high:.2f})"


def _dropped_flag(arms: Mapping[str, ArmOutcome], obs: Observations, flags: list[str]) -> Verdict:
    base, arm = baseline_of(arms), arms.get(THINKING_OFF)
    where = ", ".join(flags)
    gate = arm_gate(
        ID,
        arm,
        base,
        reproduces(arms),
        THINKING_OFF,
        available=THINKING_OFF in obs.planned,
        missing="the thinking-off arm was not planned",
        hint="a request the thinking-off arm applies to",
    )
    if gate is not None:
        gate.rationale = f"the client sent thinking-off as {where}, ignored by llama-server; " + (
            gate.rationale
        )
        return gate
    assert arm is not None
    return removal_verdict(
        ID,
        arm,
        base,
        removes_text=(
            f"the client's thinking-off ({where}) never reached the chat template; sent "
            "where llama-server reads it (chat_template_kwargs.enable_thinking) it removes "
            "the failure"
        ),
        unchanged_text=(
            f"the client's thinking-off ({where}) was dropped, but sending it where the "
            "server reads it changes nothing"
        ),
        supports=(OBSERVATION,),
    )


def _client_view(arms: Mapping[str, ArmOutcome], facts: ClientViewFacts) -> Verdict:
    base = baseline_of(arms)
    if facts.get("wire_failed"):
        kinds = ", ".join(facts.get("wire_kinds") or []) or "a failure"
        return Verdict(
            ID,
            "rejected",
            f"the server's own stream in the capture, re-assembled, already shows {kinds}: "
            "the client did not lose a good answer",
            refutes=[OBSERVATION],
            deciding_probe=OBSERVATION,
        )
    if not facts.get("captured_failed"):
        return Verdict(
            ID,
            "rejected",
            "the client's recorded view shows no failure: nothing was lost",
            refutes=[OBSERVATION],
            deciding_probe=OBSERVATION,
        )
    if not facts.get("signature"):
        return suspect(
            ID,
            "the client's view fails while the server's stream passes, but the difference "
            "matches no documented client signature, so it cannot be replayed",
            "a client-view capture whose loss matches a documented signature",
            supports=[OBSERVATION],
        )
    streamed: StreamedReplays = facts.get("streamed") or {}
    n = int(streamed.get("n") or 0)
    server_k, client_k = (
        int(streamed.get("server_failures") or 0),
        int(streamed.get("client_failures") or 0),
    )
    server, client = _kn(server_k, n), _kn(client_k, n)
    decision = streamed.get("decision")
    if decision == "unchanged":
        return Verdict(
            ID,
            "rejected",
            f"the server's streamed answers fail as often as the client's view of them: "
            f"server {server} vs client {client}",
            refutes=[OBSERVATION],
            deciding_probe=OBSERVATION,
        )
    if decision != "removes":
        return suspect(
            ID,
            f"streamed replays undecided: server {server} vs through the client {client}",
            f"{OBSERVATION} with more streamed replays",
            supports=[OBSERVATION],
        )
    if base.n < MIN_BASELINE or reproduces(arms):
        return suspect(
            ID,
            f"the streams are lost by the client ({client} vs server {server}), but the "
            f"non-streamed baseline {base.kn()} "
            + ("reproduces the failure too" if base.n >= MIN_BASELINE else "is too short"),
            f"baseline with at least {MIN_BASELINE} replays",
            supports=[OBSERVATION],
        )
    p = streamed.get("p_value")
    return Verdict(
        ID,
        "confirmed",
        f"the server's answer was fine and the client lost it ({facts['signature']}): the "
        f"captured stream passes while the client's view fails; streamed replays "
        f"re-assembled fail {server}, the same streams through the client {client}"
        + (f" (p={p:.2g})" if isinstance(p, (int, float)) else "")
        + f"; non-streamed baseline {base.kn()}",
        supports=[OBSERVATION, "baseline"],
        deciding_probe=OBSERVATION,
    )


# A hand-written rule, not a declarative `Removal` (triage.causes): the client-view observation
# (the capture's wire stream vs the client's view) decides it, and there the server NOT
# reproducing the failure is the evidence: a removal's reproduction gate would be wrong. Only
# its dropped-flag path is a removal (by thinking-off), worded around the observation.
def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    # The facts the client-view hook stored (or the engine's error when the hook failed).
    facts = cast("ClientViewFacts | None", obs.facts.get(OBSERVATION))
    if not facts or facts.get("error"):
        why = (facts or {}).get("error") or "the client-view observation did not run"
        return suspect(ID, why, OBSERVATION, basis="untested")
    flags = list(facts.get("dropped_flags") or [])
    if flags:
        return _dropped_flag(arms, obs, flags)
    if facts.get("has_client_view"):
        return _client_view(arms, facts)
    base, off = baseline_of(arms), arms.get(THINKING_OFF)
    if reproduces(arms) and unchanged(off):
        assert off is not None
        return Verdict(
            ID,
            "rejected",
            f"the server's own replies show the failure (baseline {base.kn()}) and no "
            f"client setting removes it (thinking-off {off.kn()}); the capture holds no "
            "client view",
            refutes=["baseline", THINKING_OFF],
            deciding_probe=THINKING_OFF,
        )
    return suspect(
        ID,
        "no client evidence: the capture holds no client view (format client-view) and the "
        "request no dropped thinking flag",
        "a client-view capture (raw stream + what the client showed)",
        basis="untested",
    )


CAUSE = CauseRule(
    ID,
    12,
    "Client handling",
    "the server answered correctly but the client lost it: streamed tool-call or reasoning "
    "deltas dropped when re-assembling, only `content` read, or a thinking-off flag sent "
    "where llama-server does not read it",
    "client-view observation (capture vs streamed replays); thinking-off for a dropped flag",
    rule,
    retrospective=(
        "The server's answer was correct; the client application lost it on the way to the "
        "user (it kept only part of the streamed reply, or its thinking-off setting never "
        "reached the server)."
    ),
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
