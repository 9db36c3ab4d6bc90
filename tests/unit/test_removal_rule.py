"""The declarative "this arm removes it" rule (triage.causes.Removal), step by step, as a
cause author sees it: a symptom the baseline must show, a precheck from the stack's facts,
the arm's gate, a check once the arm ran, and texts worded from the run."""

from __future__ import annotations

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Evidence,
    Observations,
    Removal,
    Symptom,
    Verdict,
    removes,
)

ARM = "fix-arm"


def _off_by_stack(ev: Evidence) -> Verdict | None:
    if ev.obs.facts.get("stack", {}).get("feature") is False:
        return Verdict("demo", "rejected", "the stack does not use the feature")
    return None


def _other_cause(ev: Evidence) -> Verdict | None:
    if removes(ev.arm) and ev.obs.confounders:
        return Verdict("demo", "suspected", f"confounded by {ev.obs.confounders[0]}")
    return None


CAUSE = CauseRule(
    id="demo",
    number=31,
    title="t",
    mechanism="m",
    decided_by=ARM,
    removed_by=(ARM,),
    removal=Removal(
        symptom=Symptom(
            ("loop",), "{share:.0%} of the {failures} failing replies loop", min_share=0.5
        ),
        precheck=_off_by_stack,
        missing="no fix arm",
        hint="a stack with the feature",
        arm_check=_other_cause,
        removes_text=lambda ev: f"the fix ({ev.obs.facts['stack']['name']}) removes it",
        unchanged_text="the fix changes nothing",
        confirmed_note="; limit: a note only a confirmation carries",
        supports=lambda ev: ("baseline", ARM),
    ),
)


def _arms(decision: str, *, loops: int = 8) -> dict[str, ArmOutcome]:
    failing = 0 if decision == "removes" else 8
    return {
        "baseline": ArmOutcome("baseline", 8, 8, "baseline", kind_counts={"loop": loops}),
        ARM: ArmOutcome(ARM, 8, failing, decision, p_value=0.0002 if failing == 0 else 0.9),
    }


def _obs(**facts: object) -> Observations:
    return Observations(facts={"stack": {"name": "v2", **facts}}, planned=(ARM,))


def test_the_arm_removing_it_confirms_with_the_worded_text_and_its_supports() -> None:
    verdict = CAUSE.decide(_arms("removes"), _obs())
    assert verdict.status == "confirmed"
    assert verdict.rationale.startswith("the fix (v2) removes it: 0/8")
    assert verdict.rationale.endswith("; limit: a note only a confirmation carries")
    assert verdict.supports == ["baseline", ARM]  # the order `supports` gives


def test_an_unchanged_rate_rejects_without_the_confirmation_note() -> None:
    verdict = CAUSE.decide(_arms("unchanged"), _obs())
    assert verdict.status == "rejected" and verdict.refutes == [ARM]
    assert verdict.rationale.startswith("the fix changes nothing: 8/8")
    assert "limit:" not in verdict.rationale


def test_a_baseline_without_the_symptom_is_rejected_before_the_arm() -> None:
    verdict = CAUSE.decide(_arms("removes", loops=2), _obs())
    assert (verdict.status, verdict.deciding_probe) == ("rejected", "baseline")
    assert verdict.rationale == "25% of the 8 failing replies loop"


def test_a_baseline_that_does_not_reproduce_attributes_nothing() -> None:
    arms = {**_arms("removes"), "baseline": ArmOutcome("baseline", 8, 0, "baseline")}
    verdict = CAUSE.decide(arms, _obs(feature=False))
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert "did not reproduce" in verdict.rationale


def test_the_precheck_decides_from_the_stack_before_any_replay() -> None:
    verdict = CAUSE.decide(_arms("removes"), _obs(feature=False))
    assert verdict.rationale == "the stack does not use the feature"


def test_an_arm_not_in_the_plan_leaves_it_untested_naming_what_would_decide() -> None:
    obs = Observations(facts={"stack": {"name": "v2"}}, planned=())
    verdict = CAUSE.decide(_arms("removes"), obs)
    assert verdict.status == "suspected" and verdict.basis == "untested"
    assert verdict.rationale == "not testable with this stack: no fix arm"
    assert verdict.deciding_probe == f"{ARM} (a stack with the feature)"


def test_the_arm_check_overrules_a_removal_it_cannot_attribute() -> None:
    obs = Observations(
        facts={"stack": {"name": "v2"}}, planned=(ARM,), confounders=["the template"]
    )
    verdict = CAUSE.decide(_arms("removes"), obs)
    assert (verdict.status, verdict.rationale) == ("suspected", "confounded by the template")
