"""Causes and probe arms are catalogue entries: a plugin's cause and server-level arm are
planned, scheduled and judged with no change to the engine, and the diagnosis schema takes
their ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import DiagnosisError, validate_diagnosis
from triage.catalogue import Catalogue, catalogue
from triage.causes import ArmOutcome, CauseRule, Observations, decide, removal_verdict
from triage.observe import speculative_props
from triage.probes import PlannedArm, plan_arms
from triage.stackfile import parse_stack


class ThreadsArm:
    id, level, order = "threads-1", "server", 95

    def plan(self, stack: Any, request: dict[str, Any]) -> PlannedArm | None:
        server = stack.server
        return PlannedArm(
            self.id,
            "one thread",
            self.level,
            ("thread-race",),
            config=server.with_args([*server.args, "-t", "1"]),
        )


def _rule(arms: Any, obs: Observations) -> Any:
    return removal_verdict(
        "thread-race",
        arms["threads-1"],
        arms["baseline"],
        removes_text="one thread removes it",
        unchanged_text="no change",
    )


def _register(cat: Catalogue) -> None:
    cat.causes.add(
        CauseRule("thread-race", 64, "A race between threads", "races", "threads-1", _rule)
    )
    cat.arms.add(ThreadsArm())


@pytest.fixture
def with_plugin() -> Catalogue:
    cat = Catalogue.load()
    cat.register_plugin("third-party", _register)
    return cat


def test_builtins_are_registered_through_entry_points() -> None:
    cat = catalogue()
    numbers = cat.causes.numbers()
    assert numbers["reasoning-exhausts-budget"] == 0 and numbers["token-limit"] == 5
    assert numbers["speculative-decoding"] == 1 and numbers["server-build"] == 3
    assert {"thinking-off", "spec-off", "alt-weights", "no-repack"} <= set(cat.arms.ids())


def test_a_plugin_arm_is_planned_and_its_cause_judged(
    with_plugin: Catalogue, tmp_path: Path
) -> None:
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    stack = parse_stack('[server]\nmodel = "w.gguf"\nargs = ["-c", "512"]\n', base=tmp_path)
    request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    planned = {a.name: a for a in plan_arms(stack, request, list(with_plugin.arms))}
    assert planned["threads-1"].config is not None
    assert list(planned["threads-1"].config.args) == ["-c", "512", "-t", "1"]
    assert planned["threads-1"].decides == ("thread-race",)
    assert "no-repack" not in [a.name for a in plan_arms(stack, request) if a.when == "always"]
    arms = {
        "baseline": ArmOutcome("baseline", 8, 8, "baseline", kind_counts={"timeout": 8}),
        "threads-1": ArmOutcome("threads-1", 8, 0, "removes", p_value=0.0001),
    }
    verdicts = {v.cause: v for v in decide(arms, Observations(), list(with_plugin.causes))}
    assert verdicts["thread-race"].status == "confirmed"
    assert verdicts["thread-race"].supports == ["threads-1"]


def test_the_diagnosis_schema_takes_plugin_ids_and_refuses_bad_ones() -> None:
    diagnosis: dict[str, Any] = {
        "schema_version": 1,
        "incident": "x",
        "findings": [],
        "graph": {"nodes": 0, "edges": 0},
        "arms": [
            {
                "name": "threads-1",
                "variant": "one thread",
                "level": "server",
                "n": 8,
                "failures": 0,
                "rate": 0.0,
                "ci95": [0.0, 0.32],
                "p_value": 0.0001,
                "decision": "removes",
            }
        ],
        "causes": [
            {"id": "thread-race", "status": "confirmed", "rationale": "r", "evidence": ["E1"]}
        ],
    }
    validate_diagnosis(diagnosis)
    diagnosis["causes"][0]["id"] = "Not An Id!"
    with pytest.raises(DiagnosisError, match=r"\$\.causes\[0\]\.id"):
        validate_diagnosis(diagnosis)


@pytest.mark.parametrize(
    "params, enabled",
    [
        ({"speculative.types": "draft-simple"}, True),
        ({"speculative.types": "none"}, False),
        ({"speculative": {"types": "ngram-cache,draft-simple"}}, True),
    ],
)
def test_speculative_decoding_is_read_from_props(params: dict[str, Any], enabled: bool) -> None:
    facts = speculative_props({"default_generation_settings": {"params": params}})
    assert facts["speculative"] is enabled
    assert speculative_props({"build_info": "b1"}) == {}
