"""Real-model drills: real small GGUF models from PyPI packages (triage.drills.real), real
prompts, and ground truth ESTABLISHED BY MEASUREMENT on llama-server b11434, not by design.

Each drill's manifest says what was measured (`measured`: the command, the seeds, the
finish reasons and completion-token counts of the unrestricted replies, what the replies
contain) and, from that, which cause is real. Nothing here is tuned: the models are what the
packages ship, the prompts are plain user prompts.

- `real-smollm2-token-limit` (issue 23, case 1): SmolLM2-135M-Instruct, `-c 2048 -np 1`,
  "Explain in detail how a bicycle gear system works.", max_tokens 24, temperature 0.8.
  Every reply stops on length at 24 tokens; measured without the limit (seeds 1000-1007)
  7 of 8 replies end on their own after 302-1238 tokens, one loops to the context end.
- `real-smollm2-context-size`: the same question with no max_tokens on `-c 256 -np 1`: the
  slot (256) is shorter than every answer measured (302+ tokens plus a 40-token prompt),
  so every reply stops at the context end; four times the context lets most finish.
- `real-smollm2-poem-loop` (model-loop): "Write a long poem about the sea." at temperature 0, no
  max_tokens, `-c 512 -np 1`: the reply falls into "Abe aria, aria of the sea," repeated
  until the context ends (measured on -c 1024: 986 tokens, finish length, the loop from the
  second line on; on -c 512 the same greedy text is cut at 474 tokens). No limit is the
  cause.
- `real-gemma3-base-chat`: Gemma 3 270M BASE (pretrained) served for chat: its GGUF has
  no chat template, llama-server falls back to ChatML, and the model echoes the ChatML
  markup back ("<|im_end|>\\n<|im_start|>admin\\n...") until max_tokens (200, measured:
  finish length at 200 tokens, temperature 0). No catalogue cause of the engine explains
  a base model served for chat.
- `real-smollm2-stop-cuts`: a client whose stop list holds a code fence ("```") asks
  SmolLM2 for a Python function: the answer begins with "```python", so the stop string cuts
  it at once -- content empty, finish stop, 7 of 8 seeds (seed 1007 starts with prose).
  Without `stop` 4 of 4 end on their own after 82-224 tokens with the code. No catalogue
  cause covers a client's stop string: the request-field ablation names it.
- `real-smollm2-foreign-template`: SmolLM2 (trained on ChatML) served with a Gemma-style
  chat template file (`--chat-template-file`): every reply writes the foreign turn markup
  into content ("<end_of_turn>city\n...", 8 of 8 seeds at temperature 0.8), since
  `<end_of_turn>` is not a token of its vocabulary, let alone an end-of-generation one.
  The model-file lint names the mismatch; no catalogue cause covers it.
- `real-smollm2-schema-pattern` (schema-not-enforced, issue 24): a client asks SmolLM2 for
  a date in JSON through `response_format.json_schema` with the pydantic-style pattern
  `^\\d{4}-\\d{2}-\\d{2}$`. b11434's converter does not know the `\\d` escape: it logs
  "JSON schema conversion was incomplete: pattern ... is not supported (unsupported escape:
  \\d), accepting any string", so nothing constrains the value and the model writes
  "22/09/1789", "2023-10-13T07:33:37.000Z" or a list of dates cut at max_tokens (8 of 8
  seeds violate the schema at temperature 0.8). With `\\d` written `[0-9]` (the
  schema-simplified arm) the grammar holds: 8 of 8 follow the pattern.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from kb.jsontypes import JsonObject
from triage.drills.drill import Drill, ExpectedCause, manifest_head
from triage.drills.real import MODELS, model_path

# One compute thread, as for the other drills: several servers on 2 shared cores.
THREADS = ["-t", "1", "-tb", "1"]
BICYCLE = "Explain in detail how a bicycle gear system works."
POEM = "Write a long poem about the sea."
CAPITAL = "What is the capital of France? Answer in one word."
CAPITAL_PLAIN = "What is the capital of France?"
REVERSE = "Write a Python function that reverses a string."
# A Gemma-style chat template (turns in <start_of_turn> / <end_of_turn>), the kind of file a
# deployment copies from another model family.
GEMMA_STYLE_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}{{ '<start_of_turn>' + ('model' if "
    "message['role'] == 'assistant' else message['role']) + '\n' + message['content'] + "
    "'<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model"
    "\n' }}{% endif %}\n"
)
MEASURED_WITH = "llama-server b11434, 1 thread, seeds 1000-1007 (the engine's first seeds)"
NOT_CONFIRMED = ["rejected", "suspected"]


def _cause(expected: str, why: str, accept: list[str] | None = None) -> ExpectedCause:
    accept = accept or ([expected] if expected != "not-confirmed" else NOT_CONFIRMED)
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def _write(
    name: str,
    out_dir: Path,
    model: str,
    args: list[str],
    request: JsonObject,
    manifest: JsonObject,
) -> Drill:
    """manifest.json, request-failing.json and stack.toml (the model stays in the cache)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = model_path(model)
    server_args = [*args, *THREADS]
    full = {
        **manifest_head(name),
        "real_model": {"name": model, "file": path.name, "sha256": MODELS[model].sha256},
        "server_args": server_args,
        **manifest,
        "requests": [
            {
                "name": "failing",
                "role": "failing",
                "file": "request-failing.json",
                **manifest["failing"],
            }
        ],
    }
    full.pop("failing")
    (out_dir / "request-failing.json").write_text(json.dumps(request, indent=2) + "\n")
    (out_dir / "manifest.json").write_text(json.dumps(full, indent=2) + "\n")
    stack = [
        f"# Real-model drill {name}: ground truth (measured) in manifest.json",
        "[server]",
        f"model = {json.dumps(str(path))}",
        f"args = {json.dumps(server_args)}",
        "",
    ]
    (out_dir / "stack.toml").write_text("\n".join(stack))
    return Drill(name, out_dir, {"qat": path}, full, [request], server_args)


def token_limit(out_dir: Path, template: str = "") -> Drill:
    request = {
        "messages": [{"role": "user", "content": BICYCLE}],
        "max_tokens": 24,
        "temperature": 0.8,
    }
    return _write(
        "real-smollm2-token-limit",
        out_dir,
        "smollm2-135m-instruct",
        ["-c", "2048", "-np", "1"],
        request,
        {
            "failing": {"expect": {"finish_reason": "length", "failure_rate": 1.0}},
            "measured": {
                "with": MEASURED_WITH,
                "request": "the same request without max_tokens",
                "finish": ["stop"] * 7 + ["length"],
                "completion_tokens": [377, 479, 514, 422, 1238, 302, 467, 2008],
                "prompt_tokens": 40,
                "natural_length_of_replies_that_ended": "302-1238 tokens (7 of 8)",
                "contains": "an explanation of bicycle gears; seed 1007 loops on "
                "'pulchery' until the context ends",
            },
            "causes": {
                "token-limit": _cause(
                    "confirmed",
                    "Every reply stops at max_tokens 24; without the limit 7 of 8 end on "
                    "their own after 302-1238 tokens.",
                ),
                "context-size": _cause(
                    "not-confirmed", "24 tokens plus a 40-token prompt fit the 2048 slot."
                ),
            },
        },
    )


def context_size(out_dir: Path, template: str = "") -> Drill:
    request = {"messages": [{"role": "user", "content": BICYCLE}], "temperature": 0.8}
    return _write(
        "real-smollm2-context-size",
        out_dir,
        "smollm2-135m-instruct",
        ["-c", "256", "-np", "1"],
        request,
        {
            "failing": {"expect": {"finish_reason": "length", "failure_rate": 1.0}},
            "measured": {
                "with": MEASURED_WITH + ", on -c 2048 -np 1",
                "completion_tokens": [377, 479, 514, 422, 1238, 302, 467, 2008],
                "prompt_tokens": 40,
                "slot_tokens": 256,
                "why": "every measured answer (302+ tokens) plus the prompt exceeds the "
                "256-token slot; with -c 1024, 6 of 8 (those of 302-514 tokens) fit",
            },
            "causes": {
                "context-size": _cause(
                    "confirmed",
                    "The answer (302+ tokens) does not fit the 256-token slot; four times "
                    "the context lets most replies end.",
                ),
                "token-limit": _cause("not-confirmed", "The request sets no max_tokens."),
            },
        },
    )


def poem_loop(out_dir: Path, template: str = "") -> Drill:
    request = {"messages": [{"role": "user", "content": POEM}], "temperature": 0.0}
    return _write(
        "real-smollm2-poem-loop",
        out_dir,
        "smollm2-135m-instruct",
        ["-c", "512", "-np", "1"],
        request,
        {
            "failing": {"expect": {"finish_reason": "length", "failure_rate": 1.0}},
            "measured": {
                "with": "llama-server b11434, 1 thread, temperature 0, -c 1024 -np 1",
                "finish": "length",
                "completion_tokens": 986,
                "prompt_tokens": 38,
                "contains": "'Abe aria, aria of the sea,' repeated until the context ends, "
                "from the second line on (94% of the word 5-grams of the first 474 tokens "
                "repeat)",
                "with_anti_repetition": "DRY 0.8/1.75/2 + repeat_penalty 1.1: the poem ends on "
                "its own after 257 tokens (finish stop), inside the 474 the slot leaves",
            },
            "causes": {
                "model-loop": _cause(
                    "confirmed",
                    "The answer loops from its second line; penalising repetition lets it end.",
                ),
                "token-limit": _cause("not-confirmed", "The request sets no max_tokens."),
                "context-size": _cause(
                    "not-confirmed",
                    "The loop never ends: a larger context only holds a longer loop.",
                ),
            },
        },
    )


def gemma_base_chat(out_dir: Path, template: str = "") -> Drill:
    request = {
        "messages": [{"role": "user", "content": CAPITAL}],
        "max_tokens": 200,
        "temperature": 0.0,
    }
    return _write(
        "real-gemma3-base-chat",
        out_dir,
        "gemma3-270m",
        ["-c", "1024", "-np", "1"],
        request,
        {
            "failing": {"expect": {"finish_reason": "length", "failure_rate": 1.0}},
            "expected_verdict": "unexplained",
            "measured": {
                "with": "llama-server b11434, 1 thread, temperature 0",
                "finish": "length",
                "completion_tokens": 200,
                "contains": "the question and ChatML markup echoed back "
                "('<|im_end|>\\n<|im_start|>admin\\n...'): the GGUF has no chat template, the "
                "server falls back to ChatML, and the base model continues the transcript",
            },
            "causes": {
                "token-limit": _cause(
                    "not-confirmed",
                    "The model never ends its turn: lifting the limit only lengthens the echo.",
                ),
                "model-loop": _cause(
                    "not-confirmed",
                    "A base model continuing a transcript, not a loop to break: with DRY and "
                    "repeat_penalty it still runs to max_tokens (measured, 2 of 2).",
                ),
            },
        },
    )


def stop_cuts(out_dir: Path, template: str = "") -> Drill:
    request = {
        "messages": [{"role": "user", "content": REVERSE}],
        "temperature": 0.8,
        "stop": ["```"],
    }
    return _write(
        "real-smollm2-stop-cuts",
        out_dir,
        "smollm2-135m-instruct",
        ["-c", "2048", "-np", "1"],
        request,
        {
            "failing": {"expect": {"finish_reason": "stop", "failure_rate": 0.875}},
            "expected_verdict": "unexplained",
            "expected_request_fields": ["stop"],
            "measured": {
                "with": MEASURED_WITH + ", -c 2048 -np 1",
                "finish": ["stop"] * 8,
                "completion_tokens": [1, 1, 1, 1, 1, 1, 1, 56],
                "contains": "7 of 8 replies empty: the answer opens with '```python' and the "
                "stop string ends it at its first token; seed 1007 opens with prose and stops "
                "at the fence after 56 tokens",
                "without_stop": "seeds 1000-1003: the code and its explanation, finish stop "
                "after 152, 82, 106, 224 tokens",
            },
            "causes": {
                "token-limit": _cause("not-confirmed", "The request sets no max_tokens."),
                "context-size": _cause(
                    "not-confirmed", "A one-token reply fits any slot; the stop string cuts it."
                ),
                "model-loop": _cause("not-confirmed", "An empty reply does not loop."),
            },
        },
    )


def foreign_template(out_dir: Path, template: str = "") -> Drill:
    out_dir.mkdir(parents=True, exist_ok=True)
    template_file = out_dir / "gemma-style.jinja"
    template_file.write_text(GEMMA_STYLE_TEMPLATE)
    request = {
        "messages": [{"role": "user", "content": CAPITAL_PLAIN}],
        "max_tokens": 200,
        "temperature": 0.8,
    }
    return _write(
        "real-smollm2-foreign-template",
        out_dir,
        "smollm2-135m-instruct",
        ["-c", "1024", "-np", "1", "--chat-template-file", str(template_file)],
        request,
        {
            "failing": {"expect": {"finish_reason": "stop", "failure_rate": 1.0}},
            "expected_verdict": "unexplained",
            "measured": {
                "with": MEASURED_WITH + ", -c 1024 -np 1, --chat-template-file (Gemma style)",
                "finish": ["stop", "length", "stop", "stop", "length", "length", "stop", "stop"],
                "completion_tokens": [25, 200, 39, 119, 200, 200, 125, 39],
                "contains": "every reply writes Gemma turn markup into content "
                "('<end_of_turn>city\\n...', '</start_of_turn>...<end_of_turn>'): the model "
                "was trained on ChatML, and <end_of_turn> is no token of its vocabulary",
            },
            "causes": {
                "token-limit": _cause(
                    "not-confirmed", "Most replies stop on their own with the markup in them."
                ),
                "server-flags": _cause(
                    "not-confirmed", "No flag is refused; the template file is served as given."
                ),
                "model-loop": _cause("not-confirmed", "The replies do not loop."),
            },
        },
    )


DATE_PATTERN = r"^\d{4}-\d{2}-\d{2}$"
BASTILLE = "When did the storming of the Bastille happen? Answer in JSON."


def schema_pattern(out_dir: Path, template: str = "") -> Drill:
    schema = {
        "type": "object",
        "properties": {"date": {"type": "string", "pattern": DATE_PATTERN}},
        "required": ["date"],
    }
    request = {
        "messages": [{"role": "user", "content": BASTILLE}],
        "max_tokens": 64,
        "temperature": 0.8,
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "event_date", "schema": schema},
        },
    }
    return _write(
        "real-smollm2-schema-pattern",
        out_dir,
        "smollm2-135m-instruct",
        ["-c", "1024", "-np", "1"],
        request,
        {
            "failing": {"expect": {"failure_rate": 1.0}},
            "measured": {
                "with": MEASURED_WITH + ", -c 1024 -np 1",
                "server_log": "WARNING: JSON schema conversion was incomplete: pattern "
                "^\\d{4}-\\d{2}-\\d{2}$ is not supported (unsupported escape: \\d), "
                "accepting any string (once per request)",
                "finish": ["length", "stop", "stop", "stop", "length", "length", "length", "stop"],
                "contains": "8 of 8 violate the pattern: '2023-10-13T07:33:37.000Z', "
                "'22/09/1789', '22 July 1789,', lists of dates cut at max_tokens 64",
                "with_digits_as_class": "the pattern as ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ (no warning "
                "logged): 8 of 8 follow it ('2020-05-10', '2023-10-13', '2204-01-12', ...; "
                "the model does not know the date, the grammar holds the shape), finish stop "
                "after 20-25 tokens",
            },
            "causes": {
                "schema-not-enforced": _cause(
                    "confirmed",
                    "The converter accepts any string for a pattern with \\d (its log says "
                    "so); written with [0-9] the grammar enforces it and every reply follows "
                    "the client's schema.",
                ),
                "token-limit": _cause(
                    "not-confirmed",
                    "The replies cut at max_tokens violate the pattern before the cut; the "
                    "ones that stop on their own violate it too.",
                ),
                "structured-output": _cause(
                    "not-confirmed", "The content is there; it is the wrong shape."
                ),
            },
        },
    )


BUILDERS: dict[str, Callable[[Path, str], Drill]] = {
    "real-smollm2-token-limit": token_limit,
    "real-smollm2-context-size": context_size,
    "real-smollm2-poem-loop": poem_loop,
    "real-gemma3-base-chat": gemma_base_chat,
    "real-smollm2-stop-cuts": stop_cuts,
    "real-smollm2-foreign-template": foreign_template,
    "real-smollm2-schema-pattern": schema_pattern,
}
