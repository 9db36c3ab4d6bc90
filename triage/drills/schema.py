"""The structured-output drill `schema-not-enforced`: a 1-layer model on the official Qwen3.5
template that, after its thought, answers in plain text ("It is in Paris.") unless a grammar
constrains it, when its second choice -- `{"city": "Paris"}` -- is the only one allowed.

The failing request carries its JSON Schema as vLLM's `guided_json`, a field llama-server
b11434 does not read: nothing constrains the reply, the content is plain text with HTTP 200
(measured). The same schema where b11434 reads it (`response_format: {type: json_schema,
json_schema: {schema}}`) gives the JSON answer. Exact, not a stand-in: which fields the
server reads is llama-server's own request parsing, whatever the model.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from triage.drills import gemma4, reason
from triage.drills.drill import Drill, ExpectedCause, finish
from triage.drills.language import Design, TokenKind, Vocabulary

NAME = "schema-not-enforced"
PLAIN_PIECES = ("It", " is", " in", " Paris", ".")
CITY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"city": {"type": "string"}},
    "required": ["city"],
    "additionalProperties": False,
}
# The masked pick after the thought: small enough never to win without a grammar.
JSON_SECOND_CHOICE = 0.03


def design() -> gemma4.DrillDesign:
    """Think, `</think>`, then plain text (0.97) or the JSON answer (0.03, a grammar's pick)."""
    vocab = Vocabulary()
    for text, kind in (
        ("<unk>", TokenKind.UNKNOWN),
        ("<bos>", TokenKind.CONTROL),
        ("<eos>", TokenKind.CONTROL),
        ("<pad>", TokenKind.CONTROL),
        *reason.QWEN35_TOKENS,
    ):
        vocab.add(text, kind)
    for byte in range(256):
        vocab.add(f"<0x{byte:02X}>", TokenKind.BYTE)
    spec = Design(name="qwen35-schema", vocab=vocab)
    blank_line = vocab.add("\n\n", score=1000.0)
    thought = spec.words(spec.chunks(reason.CITY_THOUGHT, gemma4.REASONING_PIECE))
    plain = spec.words(PLAIN_PIECES)
    answer = spec.words(reason.CITY_JSON_PIECES)
    spec.link([vocab.byte(0x0A), *thought, vocab.id("</think>"), blank_line])
    spec.set(blank_line, {plain[0]: 1.0 - JSON_SECOND_CHOICE, answer[0]: JSON_SECOND_CHOICE})
    spec.link([*plain, vocab.id("<|im_end|>")])
    spec.link([*answer, vocab.id("<|im_end|>")])
    facts: dict[str, object] = {
        "thought": reason.CITY_THOUGHT,
        "plain": "".join(PLAIN_PIECES),
        "answer": "".join(reason.CITY_JSON_PIECES),
        "json_second_choice": JSON_SECOND_CHOICE,
    }
    return gemma4.DrillDesign(spec, gemma4.derive_draft(spec), facts)


def _cause(expected: str, accept: list[str], why: str) -> ExpectedCause:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes() -> dict[str, ExpectedCause]:
    """Expected verdicts: schema-not-enforced confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    return {
        "schema-not-enforced": _cause(
            "confirmed",
            ["confirmed"],
            "guided_json is not read by llama-server: plain text; the same schema in "
            "response_format.json_schema gives the JSON answer.",
        ),
        "structured-output": _cause(
            "not-confirmed", not_confirmed, "No constraint llama-server reads is set."
        ),
        "output-parsing": _cause(
            "not-confirmed", not_confirmed, "The parser splits thought and answer correctly."
        ),
        "reasoning-exhausts-budget": _cause(
            "not-confirmed", not_confirmed, "Thinking off answers plain text the same way."
        ),
        "speculative-decoding": _cause(
            "not-confirmed", not_confirmed, "Without speculative decoding: the same text."
        ),
        "quantized-weights": _cause(
            "not-confirmed", not_confirmed, "qat and mxfp4 hold the same chain."
        ),
        "server-build": _cause("suspected", ["suspected"], "Not testable: one build."),
        "token-limit": _cause("not-confirmed", not_confirmed, "Nothing stops on length."),
    }


def build(out_dir: Path, template: str) -> Drill:
    """Generate the schema-not-enforced drill into `out_dir` (the Qwen3.5 template)."""
    spec = design()
    body: dict[str, Any] = {
        "messages": [{"role": "user", "content": reason.CITY_PROMPT}],
        "max_tokens": 120,
        "temperature": 0.0,
        "guided_json": CITY_SCHEMA,
    }
    manifest = {
        "parameters": {**spec.facts, "schema": CITY_SCHEMA, "schema_field": "guided_json"},
        "causes": manifest_causes(),
        "requests": [
            {
                "name": "greedy-guided-json",
                "role": "failing",
                "expect": {
                    "status": 200,
                    "content": spec.facts["plain"],
                    "failure_rate": 1.0,
                },
            }
        ],
        "contrasts": [{"name": "relocated", "expect": {"content": spec.facts["answer"]}}],
    }
    relocated_body = {key: value for key, value in body.items() if key != "guided_json"}
    relocated_body["response_format"] = {
        "type": "json_schema",
        "json_schema": {"name": "city", "schema": CITY_SCHEMA},
    }
    return finish(
        NAME,
        spec,
        out_dir,
        reason.qwen35_template(),
        manifest,
        [body],
        {"relocated": relocated_body},
        template_source=f"llama.cpp/{reason.QWEN35_TEMPLATE.as_posix()}",
    )
