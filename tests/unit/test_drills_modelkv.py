"""The kv-cache and model-file drills without a server: designs, manifests, the attention path
the compiler writes, the cache model, and the mojibake check the kv drill's failure shows."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import pytest

from triage.checks.encoding import mojibake_runs
from triage.drills import build_drill
from triage.drills.compiler import ConstantAttention, compile_design, norm_scale
from triage.drills.kv_cache import MOJIBAKE_ANSWER, cache_roundtrip, design
from triage.symptoms import failure_kinds


def _exchange(content: str, tool_calls: list[dict[str, object]] | None = None) -> dict[str, object]:
    message: dict[str, object] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {
        "request": {"messages": [{"role": "user", "content": "weather?"}]},
        "response": {"choices": [{"message": message, "finish_reason": "stop"}]},
    }


def test_mojibake_is_utf8_read_as_cp1252_or_replacement_characters() -> None:
    assert mojibake_runs(MOJIBAKE_ANSWER) == ["\u00c3\u00a0", "\u00c2\u00b0", "\u00c3\u00a9"]
    assert mojibake_runs("it\u00e2\u20ac\u2122s") == ["\u00e2\u20ac\u2122"]
    assert mojibake_runs("bad byte \ufffd") == ["\ufffd"]
    # Real accented text and a lone capital A-tilde are not mojibake.
    for text in ("S\u00e3o Paulo, caf\u00e9 \u00e0 18\u00b0C", "\u00c3 la carte", "Paris"):
        assert mojibake_runs(text) == []


def test_mojibake_is_a_user_facing_failure_in_content_and_tool_arguments() -> None:
    assert "mojibake" in failure_kinds(_exchange(MOJIBAKE_ANSWER))
    assert failure_kinds(_exchange("Il fait beau \u00e0 Paris.")) == set()
    call = {
        "type": "function",
        "function": {"name": "w", "arguments": '{"city":"Par\u00c3\u00ads"}'},
    }
    assert "mojibake" in failure_kinds(_exchange("", [call]))


@pytest.mark.parametrize(("cache", "kept"), [("f16", 1.0), ("q8_0", 1.0), ("q4_0", 0.0)])
def test_only_a_q4_0_cache_erases_the_small_v_component(cache: str, kept: float) -> None:
    v = np.zeros(64)
    v[0], v[1] = 1.0, 0.02
    back = cache_roundtrip(v, cache)
    assert back[1] / 0.02 == pytest.approx(kept, abs=0.01)
    assert back[0] == pytest.approx(1.0, abs=0.02)  # the outlier survives every cache


def test_kv_drill_manifest_expects_failure_only_with_q4_0(tmp_path: Path) -> None:
    drill = build_drill("kv-cache-q4", tmp_path)
    rates = drill.manifest["parameters"]["failure_rate"]["temperature_0"]
    assert rates == {"f16": 0.0, "q8_0": 0.0, "q4_0": 1.0}
    assert drill.expected("kv-cache-quant") == "confirmed"
    assert [c for c, t in drill.manifest["causes"].items() if t["expected"] == "confirmed"] == [
        "kv-cache-quant"
    ]
    assert drill.server_args[-4:] == ["-ctk", "q4_0", "-ctv", "q4_0"]
    assert '"-ctv", "q4_0"' in (tmp_path / "stack.toml").read_text()
    body = json.loads((tmp_path / "request-greedy.json").read_text())
    assert body["temperature"] == 0.0 and body["tools"]


def test_constant_attention_writes_v_and_output_paths(tmp_path: Path) -> None:
    chain, call = design()
    plain = compile_design(chain, tmp_path / "plain.gguf", weight_format="F32")
    path = compile_design(
        chain,
        tmp_path / "attn.gguf",
        weight_format="F32",
        attention=ConstantAttention(token=call, delta=1.0),
    )
    tensors = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(path)).tensors}
    zeros = {t.name: np.array(t.data) for t in gguf.GGUFReader(str(plain)).tensors}
    assert not zeros["blk.0.attn_v.weight"].any() and not zeros["blk.0.attn_output.weight"].any()
    v, out = tensors["blk.0.attn_v.weight"], tensors["blk.0.attn_output.weight"]
    width = v.shape[0]
    scale = norm_scale(width)
    assert v[0] == pytest.approx(np.full(width, 1.0 / scale)) and not v[2:].any()
    assert out[width - 1, 1] == 1.0 and np.count_nonzero(out) == 1
    assert not tensors["blk.0.attn_q.weight"].any() and not tensors["blk.0.attn_k.weight"].any()
    # The spare dimension raises only the chosen token, by delta / small after the norm.
    logits = tensors["output.weight"]
    column = logits[:, width - 1]
    assert np.nonzero(column)[0].tolist() == [call]
    assert column[call] * scale * 0.02 == pytest.approx(1.0, rel=1e-5)


def test_model_file_drill_is_two_same_quant_conversions_differing_in_one_token_type(
    tmp_path: Path,
) -> None:
    drill = build_drill("model-file-token-type", tmp_path)
    models = drill.manifest["models"]
    assert models["broken"]["format"] == models["fixed"]["format"] == "Q4_0"
    assert models["broken"]["token_type"] == {'<|"|>': 3}
    assert models["fixed"]["token_type"] == {'<|"|>': 4}
    stack = (tmp_path / "stack.toml").read_text()
    assert "model-file-token-type-broken.gguf" in stack and "fixed.gguf" in stack
    assert drill.expected("model-file") == "confirmed"
