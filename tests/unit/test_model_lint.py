"""Model-file lint (issue 23): no chat template, a base model served for chat, end-of-turn
mismatches -- from GGUF metadata and the server's own log -- and chat-template markup in
content."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from triage import symptoms
from triage.drills.real import MODELS, models_dir
from triage.llama.gguf_kv import GGUFKVError, read_kv
from triage.llama.model_lint import (
    BASE_KIND,
    EOT_KIND,
    TEMPLATE_KIND,
    ModelFile,
    ServerLog,
    lint,
    lint_files,
    parse_log,
)

CHATML_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
GEMMA_TOKENS = ("<pad>", "<eos>", "<bos>", "<start_of_turn>", "<end_of_turn>", "Paris")
# Lines of llama-server b11434's -lv 4 log of Gemma 3 270M base (no template in the GGUF).
GEMMA_LOG = """\
0.00.713.966 I print_info: EOS token             = 1 '<eos>'
0.00.713.967 I print_info: EOG token             = 1 '<eos>'
0.00.713.967 I print_info: EOG token             = 106 '<end_of_turn>'
0.00.713.967 I print_info: EOG token             = 212 '</s>'
0.00.777.470 I srv          init: init: chat template, example_format: '<|im_start|>system
You are a helpful assistant<|im_end|>
<|im_start|>user
Hello<|im_end|>
<|im_start|>assistant
Hi there<|im_end|>
<|im_start|>user
How are you?<|im_end|>
<|im_start|>assistant
'
0.00.777.986 I srv          init: init: chat template, thinking = 0
"""


def _kinds(findings: list[symptoms.Finding]) -> dict[str, bool]:
    return {f.kind: f.passed for f in findings}


def _gemma_base(**changes: object) -> ModelFile:
    fields: dict[str, object] = {
        "path": "gemma.gguf",
        "name": "Gemma 3 270m",
        "naming": (("general.name", "Gemma 3 270m"), ("general.type", "model")),
        "chat_template": None,
        "tokens": GEMMA_TOKENS,
        "eog_ids": frozenset({1, 4}),
    }
    fields.update(changes)
    return ModelFile(**fields)  # type: ignore[arg-type]


def test_parse_log_reads_the_served_format_and_the_eog_tokens() -> None:
    log = parse_log(GEMMA_LOG)
    assert log.eog == ((1, "<eos>"), (106, "<end_of_turn>"), (212, "</s>"))
    assert log.example_format is not None
    assert log.example_format.startswith("<|im_start|>system\n")
    assert "Hi there<|im_end|>\n<|im_start|>user\nHow are you?" in log.example_format
    assert log.example_format.endswith("<|im_start|>assistant\n")


def test_a_base_model_without_template_fails_all_three_with_the_log() -> None:
    findings = lint(_gemma_base(), log=parse_log(GEMMA_LOG))
    assert _kinds(findings) == {TEMPLATE_KIND: False, BASE_KIND: False, EOT_KIND: False}
    by_kind = {f.kind: f for f in findings}
    assert "falls back to ChatML" in by_kind[TEMPLATE_KIND].reason
    assert "are not tokens of its vocabulary" in by_kind[TEMPLATE_KIND].reason
    assert "'<|im_end|>'" in by_kind[EOT_KIND].reason
    assert "the server's log" in by_kind[EOT_KIND].reason
    assert "not even a token" in by_kind[EOT_KIND].reason


def test_without_a_log_the_fallback_and_the_eog_set_are_computed() -> None:
    findings = lint(_gemma_base())
    assert _kinds(findings) == {TEMPLATE_KIND: False, BASE_KIND: False, EOT_KIND: False}
    assert "llama-server's fallback (ChatML)" in findings[2].reason


def test_an_instruct_model_with_its_template_passes() -> None:
    model = ModelFile(
        "smol.gguf",
        "SmolLM2",
        (("general.name", "Smollm2 135M 8k Lc100K Mix1 Ep2"),),
        CHATML_TEMPLATE,
        ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "hello"),
        frozenset({0, 2}),
    )
    assert set(_kinds(lint(model)).values()) == {True}


def test_instruct_markers_and_base_markers_in_the_metadata_decide() -> None:
    # An "-it" model whose GGUF lost its template: no template, but not a base model.
    it = _gemma_base(naming=(("general.name", "gemma-3-270m-it"),))
    assert _kinds(lint(it)) == {TEMPLATE_KIND: False, BASE_KIND: True, EOT_KIND: False}
    # A base model that ships a template (Qwen base GGUFs do): its name says base.
    base = _gemma_base(
        naming=(("general.finetune", "Base"),),
        chat_template="{{ '<start_of_turn>' }}{{ m.content }}<end_of_turn>",
    )
    findings = {f.kind: f for f in lint(base)}
    assert findings[BASE_KIND].passed is False and findings[BASE_KIND].score == 1.0
    assert findings[TEMPLATE_KIND].passed and findings[EOT_KIND].passed


def test_a_template_closing_turns_with_a_non_eog_token_is_a_mismatch() -> None:
    model = _gemma_base(
        naming=(("general.name", "x instruct"),),
        chat_template="<start_of_turn>{{ m.content }}<end_of_turn>",
        eog_ids=frozenset({1}),  # only <eos>: <end_of_turn> is a plain token here
    )
    eot = {f.kind: f for f in lint(model)}[EOT_KIND]
    assert eot.passed is False
    assert "'<end_of_turn>'" in eot.reason and "not even" not in eot.reason


def test_a_template_flag_or_a_non_chat_request_is_no_missing_template() -> None:
    flagged = lint(_gemma_base(), args=["--chat-template", "gemma"])
    assert _kinds(flagged)[TEMPLATE_KIND] is True
    assert set(_kinds(lint(_gemma_base(), chat=False)).values()) == {True}


def test_a_plain_text_turn_close_is_not_a_mismatch() -> None:
    example = "User: Hello\nAssistant: Hi there\nUser: How are you?\nAssistant:"
    model = _gemma_base(naming=(("general.name", "chat model"),), chat_template="x")
    eot = {f.kind: f for f in lint(model, log=ServerLog(example, ((1, "<eos>"),)))}[EOT_KIND]
    assert eot.passed and "no special marker" in eot.reason


def test_a_file_that_is_not_gguf_is_a_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"not a model at all")
    with pytest.raises(GGUFKVError, match="not a GGUF file"):
        read_kv(bad)
    # A key count past the bound is refused, not allocated.
    bad.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 10**9))
    with pytest.raises(GGUFKVError, match="key count"):
        read_kv(bad)
    # A file that ends inside a key names it.
    bad.write_bytes(b"GGUF" + struct.pack("<IQQQ", 3, 0, 1, 12) + b"general")
    with pytest.raises(GGUFKVError, match="ends inside"):
        read_kv(bad)
    findings, why = lint_files(bad, {"messages": []})
    assert findings == [] and why is not None and str(bad) in why


def _cached(name: str) -> Path:
    path = models_dir() / MODELS[name].file
    if not path.is_file():
        pytest.skip(f"real model {name} not cached (make models)")
    return path


def test_the_real_models_metadata() -> None:
    gemma, _ = lint_files(_cached("gemma3-270m"), {"messages": []})
    assert _kinds(gemma) == {TEMPLATE_KIND: False, BASE_KIND: False, EOT_KIND: False}
    smol, _ = lint_files(_cached("smollm2-135m-instruct"), {"messages": []})
    assert set(_kinds(smol).values()) == {True}


def _reply(content: str, question: str = "What is the capital of France?") -> dict[str, object]:
    return {
        "request": {"messages": [{"role": "user", "content": question}]},
        "response": {
            "choices": [
                {"message": {"role": "assistant", "content": content}, "finish_reason": "length"}
            ]
        },
    }


@pytest.mark.parametrize(
    "content",
    [
        "Paris<|im_end|>\n<|im_start|>admin\nWhat is",  # measured: Gemma 3 base on ChatML
        "Paris.<end_of_turn>\n<start_of_turn>user\nAnd Spain?",
        "Paris [/INST] [INST] And Spain?",
        "Paris<|eot_id|><|start_header_id|>user<|end_header_id|>",
    ],
)
def test_template_markup_in_content_is_found(content: str) -> None:
    found = [
        f for f in symptoms.classify(_reply(content)) if f.kind == "template-markup-in-content"
    ]
    assert len(found) == 1 and not found[0].passed
    assert found[0].where == "$.response.choices[0].message.content"
    assert found[0].offset == content.index("<" if "<" in content else "[")


def test_markup_the_user_asked_about_or_plain_text_is_no_leak() -> None:
    asked = _reply("ChatML wraps turns in <|im_start|> and <|im_end|>.", "What is <|im_start|>?")
    kinds = {f.kind: f.passed for f in symptoms.classify(asked)}
    # <|im_end|> was not in the question: still a leak; <|im_start|> alone would not be.
    assert kinds["template-markup-in-content"] is False
    only = _reply("It is <|im_start|>.", "What is <|im_start|>?")
    assert {f.kind: f.passed for f in symptoms.classify(only)}["template-markup-in-content"]
    plain = _reply("Paris, with <b>bold</b> and <s>strike</s> HTML.")
    assert {f.kind: f.passed for f in symptoms.classify(plain)}["template-markup-in-content"]


def test_lint_kinds_on_an_exchange_say_where_they_are_decided() -> None:
    findings = {f.kind: f for f in symptoms.classify(_reply("Paris."))}
    for kind in (TEMPLATE_KIND, BASE_KIND, EOT_KIND):
        assert findings[kind].passed and "GGUF metadata" in findings[kind].reason
