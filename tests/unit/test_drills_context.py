"""The context drills on paper: greedy paths against the slot size, ground truth, files.

The real server runs them in tests/integration/test_drill_ctx.py.
"""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

import triage.drills as drills
from triage.drills import context
from triage.drills.gemma4 import CAUSE_IDS

STATUSES = {"confirmed", "rejected", "suspected"}


def test_context_size_answer_outgrows_the_slot_but_fits_four_times_it() -> None:
    design, facts = context.context_size_design()
    path = design.greedy_path(design.vocab.byte(0x0A), 5000)
    # The chain ends its turn: the reply is finite and ends with <turn|>.
    assert design.vocab.tokens[path[-1]].text == "<turn|>"
    assert len(path) == facts["generated_tokens"]  # measured on b11434: 319 completion tokens
    slot = facts["n_ctx_slot"]
    assert slot == context.INCIDENT_CONTEXT // context.SLOTS == 256
    # Any prompt leaves the reply too long for the slot, yet short of max_tokens ...
    assert slot < len(path) < context.MAX_TOKENS
    # ... and a few hundred prompt tokens still fit the slot at four times the context.
    assert len(path) + 600 < facts["n_ctx_slot_at_4x"]
    text = design.text_of(path)
    assert text.endswith("log closed for the morning watch.<turn|>")


def test_context_shift_chain_loops_for_ever_at_temperature_0() -> None:
    design, facts = context.context_shift_design()
    path = design.greedy_path(design.vocab.byte(0x0A), 3000)
    assert len(path) == 3000  # never reaches a token without successors
    ends = {design.vocab.id(t) for t in ("<turn|>", "<eos>")}
    assert not ends & set(path)
    tail = design.text_of(path[-200:])
    assert tail.count(context.TIDE_CYCLE.strip()) >= 5
    assert facts["cycle_tokens"] < facts["n_ctx_slot"]


@pytest.fixture
def stand_in_template(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    text = "{{ bos_token }}{% for m in messages %}{{ m.content }}{% endfor %}"
    path = tmp_path / "template.jinja"
    path.write_text(text)
    monkeypatch.setenv("TRIAGE_GEMMA4_TEMPLATE", str(path))
    return text


@pytest.mark.parametrize(
    ("name", "confirmed", "flag"),
    [("context-size", "context-size", None), ("context-shift", "context-shift", "--context-shift")],
)
def test_generated_files_state_the_ground_truth(
    tmp_path: Path, stand_in_template: str, name: str, confirmed: str, flag: str | None
) -> None:
    assert name in drills.list_drills()
    drill = drills.build_drill(name, tmp_path / name)
    manifest = json.loads((drill.out_dir / "manifest.json").read_text())
    assert manifest == drill.manifest
    causes = manifest["causes"]
    assert set(CAUSE_IDS) | {"context-size", "context-shift"} <= set(causes)
    assert [c for c, truth in causes.items() if truth["expected"] == "confirmed"] == [confirmed]
    for truth in causes.values():
        assert set(truth["accept"]) <= STATUSES and truth["why"]
    stack = tomllib.loads((drill.out_dir / "stack.toml").read_text())
    args = stack["server"]["args"]
    assert args[:4] == ["-c", "1024", "-np", "4"]
    assert (flag in args) if flag else ("--context-shift" not in args)
    assert (drill.out_dir / stack["server"]["model"]).is_file()
    for described, body in zip(manifest["requests"], drill.requests, strict=True):
        assert json.loads((drill.out_dir / described["file"]).read_text()) == body


def test_context_shift_request_sets_no_max_tokens_and_context_size_does(
    tmp_path: Path, stand_in_template: str
) -> None:
    shift = drills.build_drill("context-shift", tmp_path / "shift")
    assert "max_tokens" not in shift.request("unbounded")
    assert shift.manifest["replay_timeout"] > 0
    size = drills.build_drill("context-size", tmp_path / "size")
    assert size.request("greedy")["max_tokens"] == context.MAX_TOKENS
    assert context.PASTED_NOTE in size.request("long-prompt")["messages"][0]["content"]
