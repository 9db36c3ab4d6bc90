"""Issue 28 item 3: an arm that got no replies is reported with its reason -- in the table
and the JSON -- and the run does not claim `done` for it (a resumed URL run left
`token-limit-lifted 0/0` out of the table, JSON state `done`, no error)."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from kb.domain.diagnosis import Finding, Reproduction, validate_diagnosis
from kb.domain.records import Reply
from kb.repo.store import Store
from triage.commands.engine import format_diagnosis
from triage.engine import Diagnoser
from triage.engine.decide import Execution, decide
from triage.engine.naming import ModelIdentity
from triage.engine.record import record
from triage.engine.scheduler import ArmState, Scheduler
from triage.stackfile import parse_stack

REQUEST = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 64}
TIMEOUT = "no complete answer from http://127.0.0.1:9/v1/chat/completions within 180s"


def _reply(arm: str, index: int, *, failed: bool = True, error: str = "") -> Reply:
    kinds = ["timeout"] if error else (["length-stop"] if failed else [])
    return Reply(
        arm, index, 1000 + index, failed, kinds, None if error else "length", 0, 0,
        None if error else 200, 1.0, {}, error=error,
    )  # fmt: skip


class TimeoutsFor:
    """Every replay of `arm` ends without an answer; the others fail (length stops)."""

    def __init__(self, arm: str) -> None:
        self.arm = arm
        self.sent: list[int] = []

    async def replay(self, arm: str, indices: Sequence[int]) -> list[Reply]:
        if arm == self.arm:
            self.sent.extend(indices)
            return [_reply(arm, i, error=TIMEOUT) for i in indices]
        return [_reply(arm, i) for i in indices]


def test_an_arm_whose_replays_all_end_without_an_answer_stops_with_the_reason() -> None:
    arms = {
        "baseline": ArmState("baseline", "as sent", "request", "g"),
        "token-limit-lifted": ArmState(
            "token-limit-lifted", "x4", "request", "g", ("token-limit",)
        ),
    }
    replayer = TimeoutsFor("token-limit-lifted")
    asyncio.run(Scheduler([4, 8], 8).run(arms, ["token-limit-lifted"], replayer))
    x4 = arms["token-limit-lifted"]
    assert x4.decision == "errored" and x4.n == 0
    assert x4.error.startswith("no replies: 4 of 4 replays ended without an answer")
    assert TIMEOUT in x4.error
    assert replayer.sent == [0, 1, 2, 3]  # not another look of replays that cannot count


def test_a_run_with_an_arm_without_replies_reports_it_and_is_not_done(
    store: Store, tmp_path: Path
) -> None:
    stack = parse_stack('[server]\nurl = "http://127.0.0.1:9"\n', base=tmp_path, source="s.toml")
    findings = [Finding("length-stop", False, 1.0, "cut", "$")]
    diagnoser = Diagnoser(store, stack, REQUEST, findings=findings)
    diagnoser.identity = ModelIdentity("SmolLM2-135M-Instruct")  # no server to ask here
    diagnoser._prepare(diagnoser.plan)
    execution = Execution(diagnoser.plan, diagnoser.plan.states())
    assert "token-limit-lifted" in execution.arms
    execution.arms["baseline"].replies = [_reply("baseline", i) for i in range(8)]
    # What the resumed run recorded for the arm: 8 replays, none answered.
    execution.arms["token-limit-lifted"].replies = [
        _reply("token-limit-lifted", i, error=TIMEOUT) for i in range(8)
    ]
    execution.reproduction = Reproduction(True, "reproduced")
    decision = decide(execution, [], 0.0)
    recorded = record(diagnoser.recorder, decision, findings, execution.plan.skipped)
    diagnosis = recorded.to_json()
    validate_diagnosis(diagnosis)
    arms = {a["name"]: a for a in diagnosis["arms"]}
    x4 = arms["token-limit-lifted"]
    assert (x4["n"], x4["decision"]) == (0, "errored")
    assert x4["error"].startswith("no replies: 8 of 8 replays ended without an answer")
    assert diagnosis["state"] == "partial"
    undecided = diagnosis["undecided"]
    assert any(e.startswith("arm token-limit-lifted errored: no replies") for e in undecided)
    # Arms that never replayed are in the table too, with why.
    unrun = [a for a in arms.values() if a["n"] == 0 and a["decision"] == "not-run"]
    assert all(a["stopped"] for a in unrun)
    text = format_diagnosis(recorded)
    assert "token-limit-lifted" in text and "ERROR: no replies: 8 of 8" in text
    assert all(f"NOT RUN: {a['stopped']}" in text for a in unrun)
    token_limit = {c["id"]: c for c in diagnosis["causes"]}["token-limit"]
    assert token_limit["status"] == "suspected"
