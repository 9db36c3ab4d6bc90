"""GGUF metadata reader on compiled drill weights and on files that are not GGUF."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import triage.llama as llama
from triage.drills import gemma4
from triage.drills.compiler import compile_design
from triage.llama.gguf_meta import GGUFMetaError, quantization_name, read_gguf_meta

TEMPLATE = "{%- if enable_thinking -%}<|think|>{%- endif -%}{{ '<|tool_call>call:' }}"


@pytest.fixture(scope="module")
def weights(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("meta")
    design = gemma4.toolcall_design().design
    return {
        fmt: compile_design(
            design,
            folder / f"{fmt}.gguf",
            weight_format=fmt,
            chat_template=TEMPLATE,
            model_name=f"drill-{fmt}",
        )
        for fmt in ("Q4_0", "MXFP4", "F32")
    }


def test_reads_the_facts_that_matter(weights: dict[str, Path]):
    meta = read_gguf_meta(weights["Q4_0"])
    assert meta.architecture == "llama"
    assert meta.name == "drill-Q4_0"
    assert meta.chat_template == TEMPLATE
    assert meta.chat_template_sha256 == hashlib.sha256(TEMPLATE.encode()).hexdigest()
    assert meta.quantization == "Q4_0" and meta.file_type == 2
    assert meta.tensor_types["Q4_0"] == 7
    assert meta.vocab_size == len(gemma4.toolcall_design().design.vocab)
    assert meta.block_count == 1 and meta.tokenizer_model == "llama"
    assert meta.is_gemma4_template and meta.template_has_thinking_switch
    assert meta.size_bytes == weights["Q4_0"].stat().st_size


def test_alternate_weights_differ_in_quantization_only(weights: dict[str, Path]):
    qat, mxfp4 = read_gguf_meta(weights["Q4_0"]), read_gguf_meta(weights["MXFP4"])
    assert qat.chat_template_sha256 == mxfp4.chat_template_sha256
    assert (qat.quantization, mxfp4.quantization) == ("Q4_0", "MXFP4_MOE")
    assert read_gguf_meta(weights["F32"]).quantization == "F32"


def test_to_dict_leaves_out_the_template_text(weights: dict[str, Path]):
    data = read_gguf_meta(weights["F32"]).to_dict()
    assert "chat_template" not in data and data["is_gemma4_template"] is True
    assert read_gguf_meta(weights["F32"]).to_dict(with_template=True)["chat_template"]


def test_not_gguf(tmp_path: Path):
    bad = tmp_path / "model.gguf"
    bad.write_text("this is not a model")
    with pytest.raises(GGUFMetaError, match="not a readable GGUF file"):
        read_gguf_meta(bad)
    with pytest.raises(GGUFMetaError, match="no such GGUF file"):
        read_gguf_meta(tmp_path / "missing.gguf")


def test_quantization_name_without_file_type():
    from collections import Counter

    assert quantization_name(None, Counter({"Q8_0": 5, "F32": 1})) == "Q8_0"
    assert quantization_name(None, Counter()) is None
    assert quantization_name(9999, Counter()) == "FILE_TYPE_9999"


def test_llama_public_surface():
    for name in llama.__all__:
        assert hasattr(llama, name), name
