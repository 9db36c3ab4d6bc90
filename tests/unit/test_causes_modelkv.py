"""kv-cache-quant and model-file: their rules, the kv-f16 arm's plan, the conversion diff,
and quantized-weights / output-parsing where a same-quant-type alternate file decides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from triage.causes import ArmOutcome, Observations, decide, observations_from
from triage.drills import gemma4
from triage.drills.compiler import compile_design
from triage.drills.language import TokenKind
from triage.drills.model_file import BROKEN_TOKEN, broken_conversion
from triage.engine.arms.kv_f16 import KvF16
from triage.llama.gguf_diff import conversion_differences
from triage.stackfile import ServerConfig, Stack, kv_cache_quantized, kv_cache_types


def _arm(name: str, k: int, n: int, decision: str, **kinds: int) -> ArmOutcome:
    counts = {key.replace("_", "-"): value for key, value in kinds.items()}
    return ArmOutcome(name, n=n, failures=k, decision=decision, p_value=0.001, kind_counts=counts)


def _verdict(cause: str, arms: dict[str, ArmOutcome], obs: Observations) -> Any:
    return {v.cause: v for v in decide(arms, obs)}[cause]


def _kv_obs(k: str, v: str, *, planned: bool, args_known: bool = True) -> Observations:
    facts = {"server-config": {"args_known": args_known, "kv_cache": {"k": k, "v": v}}}
    return Observations(facts=facts, planned=("baseline", "kv-f16") if planned else ("baseline",))


BASE = _arm("baseline", 8, 8, "baseline", parse_failure=8)


# --------------------------------------------------------------------------- kv-cache-quant


def test_kv_cache_quant_confirmed_when_f16_cache_removes_a_reproduced_failure() -> None:
    arms = {"baseline": BASE, "kv-f16": _arm("kv-f16", 0, 8, "removes")}
    verdict = _verdict("kv-cache-quant", arms, _kv_obs("q4_0", "q4_0", planned=True))
    assert verdict.status == "confirmed"
    assert (
        "0/8" in verdict.rationale and "8/8" in verdict.rationale and "95% CI" in verdict.rationale
    )
    assert "K q4_0" in verdict.rationale and verdict.supports == ["kv-f16"]


def test_kv_cache_quant_rejected_when_f16_cache_changes_nothing() -> None:
    arms = {"baseline": BASE, "kv-f16": _arm("kv-f16", 8, 8, "unchanged")}
    verdict = _verdict("kv-cache-quant", arms, _kv_obs("q8_0", "f16", planned=True))
    assert verdict.status == "rejected" and verdict.refutes == ["kv-f16"]


def test_kv_cache_quant_never_confirmed_when_the_baseline_does_not_reproduce() -> None:
    arms = {
        "baseline": _arm("baseline", 0, 8, "baseline"),
        "kv-f16": _arm("kv-f16", 0, 8, "no-baseline-failure"),
    }
    verdict = _verdict("kv-cache-quant", arms, _kv_obs("q4_0", "q4_0", planned=True))
    assert verdict.status == "suspected" and verdict.basis == "untested"


def test_kv_cache_quant_undecided_arm_leaves_it_suspected() -> None:
    arms = {
        "baseline": _arm("baseline", 3, 16, "baseline"),
        "kv-f16": _arm("kv-f16", 1, 16, "undecided"),
    }
    verdict = _verdict("kv-cache-quant", arms, _kv_obs("q4_0", "q4_0", planned=True))
    assert verdict.status == "suspected"


def test_kv_cache_quant_rejected_without_replays_when_the_cache_is_f16() -> None:
    verdict = _verdict("kv-cache-quant", {"baseline": BASE}, _kv_obs("f16", "f16", planned=False))
    assert verdict.status == "rejected"
    assert "unquantized" in verdict.rationale


def test_kv_cache_quant_untested_for_a_bare_url_stack() -> None:
    obs = _kv_obs("f16", "f16", planned=False, args_known=False)
    verdict = _verdict("kv-cache-quant", {"baseline": BASE}, obs)
    assert verdict.status == "suspected" and verdict.basis == "untested"


def test_observations_carry_the_server_kv_cache_and_whether_args_are_known() -> None:
    stack = Stack(ServerConfig(model=Path("m.gguf"), args=("-ctk", "q4_0", "--api-key", "s3")))
    config = observations_from({}, stack, speculative=False).facts["server-config"]
    assert config["kv_cache"] == {"k": "q4_0", "v": "f16"} and config["args_known"] is True
    assert "s3" not in repr(config)  # only the cache flags, never the args themselves
    url_only = observations_from({}, Stack(ServerConfig(url="http://x")), speculative=False)
    assert url_only.facts["server-config"]["args_known"] is False


@pytest.mark.parametrize(
    ("args", "types", "quantized"),
    [
        ((), {"k": "f16", "v": "f16"}, False),
        (("-ctk", "q4_0", "-ctv", "q4_0"), {"k": "q4_0", "v": "q4_0"}, True),
        (("--cache-type-v=Q8_0",), {"k": "f16", "v": "q8_0"}, True),
        (("-ctk", "bf16", "-ctv", "f32"), {"k": "bf16", "v": "f32"}, False),
    ],
)
def test_kv_cache_flags(args: tuple[str, ...], types: dict[str, str], quantized: bool) -> None:
    assert kv_cache_types(args) == types
    assert kv_cache_quantized(args) is quantized


def test_kv_f16_arm_planned_only_for_a_quantized_cache_and_changes_only_the_cache() -> None:
    arm = KvF16()
    plain = Stack(ServerConfig(model=Path("m.gguf"), args=("-c", "4096")))
    assert arm.plan(plain, {}) is None
    url_only = Stack(ServerConfig(url="http://127.0.0.1:8080", args=("-ctk", "q4_0")))
    assert arm.plan(url_only, {}) is None
    args = ("-c", "4096", "--cache-type-k=q4_0", "-ctv", "q4_0", "-fa", "on")
    planned = arm.plan(Stack(ServerConfig(model=Path("m.gguf"), args=args)), {})
    assert planned is not None and planned.config is not None
    assert planned.decides == ("kv-cache-quant",)
    new = planned.config.args
    assert kv_cache_types(new) == {"k": "f16", "v": "f16"}
    assert [a for a in new if a not in ("-ctk", "-ctv", "f16")] == ["-c", "4096", "-fa", "on"]
    assert planned.config.model == Path("m.gguf")


# --------------------------------------------------------------------------- model-file


def _weights_obs(quants: list[str], **extra: Any) -> Observations:
    facts = {"weights-confounder": {"quantization": quants, "differs": [], **extra}}
    return Observations(has_alt_weights=True, facts=facts)


def test_model_file_confirmed_by_a_same_quant_type_conversion_that_removes_it() -> None:
    arms = {"baseline": BASE, "alt-weights": _arm("alt-weights", 0, 8, "removes")}
    obs = _weights_obs(["Q4_0", "Q4_0"], conversion_differs=["token '<|\"|>' (id 18) type 3 vs 4"])
    verdicts = {v.cause: v for v in decide(arms, obs)}
    model_file = verdicts["model-file"]
    assert model_file.status == "confirmed"
    assert "type 3 vs 4" in model_file.rationale and "0/8" in model_file.rationale
    # Same quant type: the quantization is not what differs.
    assert verdicts["quantized-weights"].status == "suspected"
    assert "conversion" in verdicts["quantized-weights"].rationale


def test_model_file_rejected_when_another_conversion_changes_nothing() -> None:
    arms = {"baseline": BASE, "alt-weights": _arm("alt-weights", 8, 8, "unchanged")}
    verdict = _verdict("model-file", arms, _weights_obs(["Q4_0", "Q4_0"]))
    assert verdict.status == "rejected"


def test_model_file_untested_when_the_quant_types_differ_and_weights_decide_as_before() -> None:
    for decision, k, expected in (("removes", 0, "confirmed"), ("unchanged", 8, "rejected")):
        arms = {"baseline": BASE, "alt-weights": _arm("alt-weights", k, 8, decision)}
        verdicts = {v.cause: v for v in decide(arms, _weights_obs(["Q4_0", "MXFP4"]))}
        assert verdicts["model-file"].status == "suspected"
        assert verdicts["model-file"].basis == "untested"
        assert verdicts["quantized-weights"].status == expected


def test_model_file_needs_alternate_weights_and_a_reproduced_failure() -> None:
    verdict = _verdict("model-file", {"baseline": BASE}, Observations())
    assert verdict.status == "suspected" and "no alternate weights" in verdict.rationale
    arms = {
        "baseline": _arm("baseline", 0, 8, "baseline"),
        "alt-weights": _arm("alt-weights", 0, 8, "no-baseline-failure"),
    }
    assert _verdict("model-file", arms, _weights_obs(["Q4_0", "Q4_0"])).status == "suspected"


# --------------------------------------------------------------------------- conversion diff


def test_conversion_differences_name_the_token_whose_type_changed(tmp_path: Path) -> None:
    design = gemma4.toolcall_design().design
    broken = broken_conversion(design, BROKEN_TOKEN, TokenKind.CONTROL)
    assert design.vocab.tokens[design.vocab.id(BROKEN_TOKEN)].kind == TokenKind.USER_DEFINED
    good = compile_design(design, tmp_path / "good.gguf", weight_format="Q4_0")
    bad = compile_design(broken, tmp_path / "bad.gguf", weight_format="Q4_0")
    other = compile_design(design, tmp_path / "tpl.gguf", weight_format="Q4_0", chat_template="x")
    assert conversion_differences(good, good) == []
    (line,) = conversion_differences(bad, good)
    assert BROKEN_TOKEN in line and "type 3 vs 4" in line
    assert conversion_differences(good, other) == ["the embedded chat template"]
