"""The shared Gemma 4 drill designs, manifests and generated files (stand-in template).

The real template and server are used in tests/integration/test_llama_drills.py; here the
designs are checked on paper: greedy paths, lengths, branch probabilities, ground truth.
"""

from __future__ import annotations

import json
import time
import tomllib
from pathlib import Path

import pytest

import triage.drills as drills
from triage.drills import gemma4
from triage.drills.gemma4 import CAUSE_IDS

VERDICTS = {"confirmed", "rejected", "suspected", "not-confirmed"}
STATUSES = {"confirmed", "rejected", "suspected"}


def test_public_surface():
    for name in drills.__all__:
        assert hasattr(drills, name), name
    # The shared drills, plus the drills each issue-13 cause adds beside them.
    assert {"gemma4-thinking-budget", "gemma4-toolcall"} <= set(drills.list_drills())
    assert drills.list_drills() == sorted(drills.list_drills())


def test_thinking_budget_greedy_path_is_the_incident_shape():
    spec = gemma4.thinking_budget_design()
    design = spec.design
    vocab = design.vocab
    path = design.greedy_path(vocab.byte(0x0A), 800)
    text = design.text_of(path)
    assert len(path) == 800  # never leaves the thought at temperature 0
    assert text.startswith("<|channel>thought\nThe user wants")
    assert "<channel|>" not in text
    reasoning = gemma4.expected_reasoning_chars(design, 800)
    assert 2600 <= reasoning <= 3000  # the incident: 2797
    # Thinking off: the prompt ends in <channel|>, the model answers and stops.
    answer_path = design.greedy_path(vocab.id("<channel|>"), 800)
    assert answer_path[-1] == vocab.id("<turn|>")
    answer = design.text_of(answer_path[:-1])
    assert answer == gemma4.HARBOUR_PARAGRAPH and len(answer) == 687


def test_thinking_budget_loop_exit_probability():
    spec = gemma4.thinking_budget_design(p=0.2)
    branches = [s for s in spec.design.transitions.values() if len(s) > 1]
    assert len(branches) == 1
    assert sorted(branches[0].values()) == pytest.approx([0.2, 0.8])


def test_thinking_budget_manifest():
    spec = gemma4.thinking_budget_design()
    manifest = gemma4.thinking_budget_manifest(spec.facts)
    params = manifest["parameters"]
    cycles = params["cycles_that_fit"]
    assert (
        cycles * params["cycle_tokens"] + params["before_loop_tokens"] + params["after_exit_tokens"]
        <= 800
    )
    assert params["failure_rate"]["temperature_1"] == pytest.approx(0.85**cycles)
    assert 0.1 < params["failure_rate"]["temperature_1"] < 0.6
    assert params["failure_rate"]["temperature_0"] == 1.0
    causes = manifest["causes"]
    assert set(causes) == set(CAUSE_IDS)
    assert causes["reasoning-exhausts-budget"]["expected"] == "confirmed"
    assert causes["quantized-weights"]["expected"] == "rejected"
    assert causes["speculative-decoding"]["expected"] == "not-confirmed"
    for cause in causes.values():
        assert cause["expected"] in VERDICTS
        assert set(cause["accept"]) <= STATUSES
        assert cause["real"] == (cause["expected"] == "confirmed")


def test_toolcall_design_paths():
    spec = gemma4.toolcall_design(q=0.3)
    design = spec.design
    vocab = design.vocab
    text = design.text_of(design.greedy_path(vocab.byte(0x0A), 100))
    assert text.endswith(
        '<channel|><|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>'
        "<|tool_response>"
    )
    off = design.text_of(design.greedy_path(vocab.id("<channel|>"), 100))
    assert off.startswith("<|tool_call>call:get_weather{")
    branch = next(s for s in design.transitions.values() if len(s) > 1)
    leaked_start = min(branch, key=branch.get)
    assert branch[leaked_start] == pytest.approx(0.3)
    leaked = design.text_of([leaked_start, *design.greedy_path(leaked_start, 10)])
    assert leaked == "<|tool_call>call:get_weather{location:Paris}<tool_call|><|tool_response>"
    manifest = gemma4.toolcall_manifest(spec.facts)
    assert manifest["causes"]["output-parsing"]["expected"] == "confirmed"
    assert set(manifest["causes"]) == set(CAUSE_IDS)


def test_draft_differs_from_target_on_some_tokens_only():
    spec = gemma4.thinking_budget_design()
    target, draft = spec.design.transitions, spec.draft.transitions
    assert target.keys() == draft.keys()
    changed = [t for t in target if target[t] != draft[t]]
    assert 0.05 < len(changed) / len(target) < 0.3
    assert spec.draft.vocab is spec.design.vocab  # compatible vocabularies


@pytest.fixture
def stand_in_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    text = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_text(text)
    monkeypatch.setenv("TRIAGE_GEMMA4_TEMPLATE", str(path))
    return text


@pytest.mark.parametrize("name", ["gemma4-thinking-budget", "gemma4-toolcall"])
def test_build_drill_writes_everything(tmp_path: Path, stand_in_template: str, name: str):
    started = time.monotonic()
    drill = drills.build_drill(name, tmp_path / name)
    assert time.monotonic() - started < 1.0
    assert set(drill.models) == {"qat", "mxfp4", "draft"}
    assert all(path.is_file() and path.suffix == ".gguf" for path in drill.models.values())
    on_disk = json.loads((drill.out_dir / "manifest.json").read_text())
    assert on_disk == drill.manifest
    assert drill.manifest["models"]["qat"]["file_type"] == "MOSTLY_Q4_0"
    assert drill.manifest["models"]["mxfp4"]["file_type"] == "MOSTLY_MXFP4_MOE"
    for described, body in zip(drill.manifest["requests"], drill.requests, strict=True):
        assert json.loads((drill.out_dir / described["file"]).read_text()) == body
        assert drill.request(described["name"]) == body
    assert "-md" in drill.server_args and str(drill.models["draft"]) in drill.server_args
    spec_args = drill.manifest["spec_args"]
    assert spec_args[:2] == ["--spec-type", "draft-simple"]
    stack = tomllib.loads((drill.out_dir / "stack.toml").read_text())
    assert stack["server"]["model"] == drill.models["qat"].name
    assert drill.models["draft"].name in stack["server"]["args"]
    assert stack["alternates"]["model"] == drill.models["mxfp4"].name
    for cause_id in CAUSE_IDS:
        assert drill.expected(cause_id) in VERDICTS


def test_unknown_drill(tmp_path: Path, stand_in_template: str):
    with pytest.raises(KeyError, match="known: .*gemma4-thinking-budget"):
        drills.build_drill("nope", tmp_path)


def test_missing_template_is_a_clear_error(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("TRIAGE_GEMMA4_TEMPLATE", str(tmp_path / "absent.jinja"))
    with pytest.raises(drills.TemplateNotFound, match="triage server build"):
        drills.build_drill("gemma4-toolcall", tmp_path / "d")
