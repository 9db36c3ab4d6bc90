"""Which run `triage diagnose --resume` continues: the caller's own.

A run belongs to one incident and one stack. Each run stores the fingerprints of its stack
(the incident's server: binary, model, args with secrets masked, URL) and of its request,
and a short label of the stack. `--resume` continues the interrupted run whose stack
fingerprint matches the stack given on the command line -- and whose request matches
`--request` and whose incident is `--incident`, when given. It never takes over a run that
a live process is still running (kb.repo.runs.owner_alive), and it refuses to guess: when runs
of more than one incident (or request) match, it lists them (slug, started, stack) and asks
for `--incident`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from typing import Any

from kb.jsontypes import JsonObject
from kb.repo.runs import RunCandidate
from triage.engine.servers import EngineError, safe_describe, server_label
from triage.stackfile import Stack

__all__ = [
    "choose_run",
    "request_fingerprint",
    "stack_fingerprint",
    "stack_label",
]

FINGERPRINTS = "fingerprints"  # key in the run plan: {"stack": ..., "request": ...}
STACK_LABEL = "stack_label"  # key in the run plan: stack_label(stack)
LISTED = 10  # runs listed in a refusal


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def stack_fingerprint(stack: Stack) -> str:
    """The identity of the stack's incident server (secret flag values masked first)."""
    return _digest(safe_describe(stack.server))


def request_fingerprint(request: JsonObject) -> str:
    return _digest(request)


def stack_label(stack: Stack) -> str:
    """One line naming the stack's server, no secrets: model file and args, or its URL."""
    return server_label(stack.server)[:200]


def _fingerprints(candidate: RunCandidate) -> JsonObject:
    value = candidate.plan.get(FINGERPRINTS)
    return value if isinstance(value, dict) else {}


def _label(candidate: RunCandidate) -> str:
    return str(candidate.plan.get(STACK_LABEL) or "stack not recorded (an older run)")


def _line(candidate: RunCandidate) -> str:
    state = f"running ({candidate.owner})" if candidate.live else candidate.state
    return (
        f"  run {candidate.id}  {candidate.slug}  started {candidate.started}  {state}  "
        f"stack: {_label(candidate)}"
    )


def choose_run(
    candidates: Sequence[RunCandidate],
    stack: Stack,
    *,
    request: JsonObject | None = None,
    incident: str | None = None,
) -> RunCandidate:
    """The one run to resume, or EngineError saying why none is (with the runs it saw).

    `candidates`: the unfinished runs, newest first (kb.repo.runs.resumable_runs, already limited
    to `incident` when given). A run of an older version (no fingerprints) matches only
    when its incident was named."""
    stack_fp = stack_fingerprint(stack)
    request_fp = request_fingerprint(request) if request is not None else None

    def same_stack(c: RunCandidate) -> bool:
        recorded = _fingerprints(c).get("stack")
        return recorded == stack_fp if recorded else incident is not None

    def same_request(c: RunCandidate) -> bool:
        recorded = _fingerprints(c).get("request")
        return request_fp is None or recorded is None or recorded == request_fp

    mine = [c for c in candidates if same_stack(c) and same_request(c)]
    live = [c for c in mine if c.live]
    idle = [c for c in mine if not c.live]
    if idle:
        groups = {(c.slug, _fingerprints(c).get("request")) for c in idle}
        if len(groups) == 1:
            return idle[0]  # the newest run of this incident and request
        raise EngineError(
            f"{len(idle)} interrupted runs of this stack belong to different incidents or "
            "requests; resume one with --incident SLUG (and --request for the request):\n"
            + "\n".join(_line(c) for c in idle[:LISTED])
        )
    scope = f" of incident {incident}" if incident else ""
    lines = [f"nothing to resume: no interrupted run{scope} of this stack ({stack_label(stack)})"]
    if live:
        lines.append("still running in another process (not touched):")
        lines += [_line(c) for c in live[:LISTED]]
    others = [c for c in candidates if c not in mine and not c.live]
    if others:
        lines.append("interrupted runs of other stacks or requests (resume them with their stack):")
        lines += [_line(c) for c in others[:LISTED]]
    if not live and not others:
        lines.append(
            "(a run interrupted before its server was up records nothing: start it again "
            "without --resume)"
        )
    raise EngineError("\n".join(lines))
