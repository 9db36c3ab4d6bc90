"""The shared Gemma 4 drills: designs, weight files and ground-truth manifests.

Both drills use the official Gemma 4 chat template, so llama-server treats them exactly like
Gemma 4: thinking on by default (`<|think|>` in the system turn), the prompt ends in
`<|turn>model\\n` (last token: the byte <0x0A>) with thinking on and in
`<|channel>thought\\n<channel|>` with thinking off. The model's first token is therefore
decided by the template alone:

* after <0x0A> it opens a thought: `<|channel>` `thought` ...
* after `<channel|>` (thinking off, or a thought that ended) it answers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kb.jsontypes import JsonObject
from triage.drills.language import Design, Vocabulary, sampled_probability

# --- texts -------------------------------------------------------------------------------

HARBOUR_PROMPT = "Write a 120-character paragraph about a harbour at dawn."

HARBOUR_PARAGRAPH = (
    "Dawn comes slowly to the harbour. First the water turns from black to pewter, then to a "
    "pale wash of rose as the sun lifts over the breakwater. Gulls wheel and argue above the "
    "moored boats, and the smell of diesel and salt drifts across the quay. A fisherman in a "
    "yellow coat coils rope with practised hands while his radio murmurs the shipping "
    "forecast. Along the sea wall the cafe owner rolls up her shutters and sets out chairs "
    "still beaded with dew. Somewhere a halyard taps against a mast in a patient rhythm. By "
    "the time the church bell strikes six, the first trawler is nosing out past the "
    "lighthouse, its wake spreading in long silver lines across the calm grey water of the bay."
)

HARBOUR_THOUGHT_OPENING = (
    "\nThe user wants a paragraph of exactly 120 characters about a harbour at dawn."
)

# One cycle of the reasoning loop. At temperature 0 it repeats forever; at temperature > 0
# the last token leaves the loop with probability p.
HARBOUR_THOUGHT_CYCLE = (
    "\nDraft: gulls wheel over a grey harbour as the first boats slip out. Count it: "
    "sixty-seven, too short. Add the fisherman coiling rope and the cafe shutters going up. "
    "Recount: one hundred and forty-one, too long now. Drop the shutters, keep the bell? "
    "Each change moves the total, so check the rhythm and count once more."
)

HARBOUR_THOUGHT_EXIT = "\nGood enough. I will write it now."

WEATHER_PROMPT = "What's the weather in Paris right now?"
WEATHER_THOUGHT = (
    "\nThe user asks for the current weather in Paris. I should call get_weather for the city."
)
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string", "description": "City name"},
            },
            "required": ["location"],
        },
    },
}


def weather_request() -> JsonObject:
    """The weather question with its tool, greedy (seed 42): the drills built on the toolcall
    chain ask it."""
    return {
        "messages": [{"role": "user", "content": WEATHER_PROMPT}],
        "tools": [WEATHER_TOOL],
        "max_tokens": 256,
        "temperature": 0.0,
        "seed": 42,
    }


CAUSE_IDS = (
    "reasoning-exhausts-budget",
    "speculative-decoding",
    "quantized-weights",
    "server-build",
    "output-parsing",
    "token-limit",
)

# Weight files of one design. "qat" is the incident's (current) file, "mxfp4" the
# alternate; both hold the same chain, stored with different tensor types.
WEIGHT_FILES = {"qat": "Q4_0", "mxfp4": "MXFP4"}
DRAFT_FORMAT = "F16"

# Token-piece sizes: ~3.5 characters per reasoning token reproduces the incident's
# "reasoning ~2800 chars in 800 tokens"; answer tokens are word-sized.
REASONING_PIECE = 3.5
ANSWER_PIECE = 7

# The draft model mispredicts every DRAFT_MISS_EVERY-th chain token, so speculative
# decoding's acceptance is measurably below 100%.
DRAFT_MISS_EVERY = 7


@dataclass
class DrillDesign:
    """A design plus the facts its manifest is computed from."""

    design: Design
    draft: Design
    facts: dict[str, object] = field(default_factory=dict)


def _base_design(name: str) -> Design:
    vocab = Vocabulary.gemma4()
    design = Design(name=name, vocab=vocab)
    # "thought" must be one token so the server's reasoning-budget sampler, which matches
    # the token ids of "<|channel>thought", sees the model open its thought. SPM only
    # reaches a token through merges of tokens, hence the chain th, tho, ... (scored high
    # so it wins over any other merge).
    for length in range(2, len("thought") + 1):
        vocab.add("thought"[:length], score=1000.0 + length)
    return design


def _opening(design: Design) -> list[int]:
    """<0x0A> (end of `<|turn>model\\n`) -> <|channel> -> thought."""
    vocab = design.vocab
    return [vocab.byte(0x0A), vocab.id("<|channel>"), vocab.id("thought")]


def derive_draft(design: Design, miss_every: int = DRAFT_MISS_EVERY) -> Design:
    """A draft model over the same vocabulary whose chain skips a token now and then."""
    draft = Design(name=f"{design.name}-draft", vocab=design.vocab, fallback=design.fallback)
    for token, successors in sorted(design.transitions.items()):
        if len(successors) == 1 and token % miss_every == 0:
            (successor,) = successors
            after = design.transitions.get(successor)
            if after and len(after) == 1:
                (skipped,) = after
                draft.transitions[token] = {skipped: 1.0}
                continue
        draft.transitions[token] = dict(successors)
    return draft


def _exit_budget(max_tokens: int, before_loop: int, cycle: int, after_exit: int) -> int:
    """How many loop cycles fit in `max_tokens` and still leave room for the answer."""
    return max(0, (max_tokens - before_loop - after_exit) // cycle)


def thinking_budget_design(p: float = 0.15) -> DrillDesign:
    """Thinking on: a reasoning loop (exit probability p per cycle); off: a ~687-char answer."""
    design = _base_design("gemma4-thinking-budget")
    vocab = design.vocab
    opening = _opening(design)
    thought_opening = design.words(design.chunks(HARBOUR_THOUGHT_OPENING, REASONING_PIECE))
    cycle = design.words(design.chunks(HARBOUR_THOUGHT_CYCLE, REASONING_PIECE))
    exit_phrase = design.words(design.chunks(HARBOUR_THOUGHT_EXIT, REASONING_PIECE))
    answer = design.words(design.chunks(HARBOUR_PARAGRAPH, ANSWER_PIECE))
    channel_end = vocab.id("<channel|>")
    turn_end = vocab.id("<turn|>")

    design.link([*opening, *thought_opening, cycle[0]])
    design.link(cycle)
    design.set(cycle[-1], {cycle[0]: 1.0 - p, exit_phrase[0]: p})
    design.link([*exit_phrase, channel_end, *answer, turn_end])

    before_loop = len(opening) - 1 + len(thought_opening)  # generated tokens before cycle 1
    after_exit = len(exit_phrase) + 1 + len(answer) + 1  # ... <channel|> answer <turn|>
    facts: dict[str, object] = {
        "p": p,
        "cycle_tokens": len(cycle),
        "cycle_chars": len(HARBOUR_THOUGHT_CYCLE),
        "before_loop_tokens": before_loop,
        "after_exit_tokens": after_exit,
        "answer_tokens": len(answer),
        "answer_chars": len(HARBOUR_PARAGRAPH),
    }
    return DrillDesign(design, derive_draft(design), facts)


def toolcall_design(q: float = 0.3) -> DrillDesign:
    """With tools: think, then call get_weather; with probability q the call leaks into the
    thought with arguments that do not parse."""
    design = _base_design("gemma4-toolcall")
    vocab = design.vocab
    opening = _opening(design)
    thought = design.words(design.chunks(WEATHER_THOUGHT, REASONING_PIECE))
    channel_end = vocab.id("<channel|>")
    quote = vocab.id('<|"|>')
    call = [
        vocab.id("<|tool_call>"),
        *design.words(["call:get_weather", "{location:"]),
        quote,
        *design.words(["Paris", '<|"|>}']),
        vocab.id("<tool_call|>"),
        vocab.id("<|tool_response>"),
    ]
    # The fragile branch writes the call inside the still-open thought, without string
    # delimiters: the server's grammar is not applied inside reasoning, so nothing stops it.
    # Plain-text pieces render the same markup the special tokens would.
    leaked = [
        *design.words(["<|tool_call>call:get_", "weather{location:", "Paris}<tool_call|>"]),
        vocab.id("<|tool_response>"),
    ]

    design.link([*opening, *thought])
    design.set(thought[-1], {channel_end: 1.0 - q, leaked[0]: q})
    design.link([channel_end, *call])
    design.link(leaked)
    facts: dict[str, object] = {
        "q": q,
        "thought_tokens": len(thought),
        "call_text": '<|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>',
        "leaked_text": "<|tool_call>call:get_weather{location:Paris}<tool_call|>",
    }
    return DrillDesign(design, derive_draft(design), facts)


# --- manifests ---------------------------------------------------------------------------


def _cause(real: bool, expected: str, accept: list[str], why: str) -> dict[str, object]:
    return {"real": real, "expected": expected, "accept": accept, "why": why}


def _number(facts: dict[str, object], key: str) -> float:
    value = facts[key]
    if not isinstance(value, (int, float)):
        raise TypeError(f"drill fact {key} is not a number: {value!r}")
    return value


def loop_failure_rate(facts: dict[str, object], max_tokens: int, temperature: float) -> float:
    """Probability that a thinking-budget run hits max_tokens before its answer ends."""
    cycles = _exit_budget(
        max_tokens,
        int(_number(facts, "before_loop_tokens")),
        int(_number(facts, "cycle_tokens")),
        int(_number(facts, "after_exit_tokens")),
    )
    exit_probability = sampled_probability(_number(facts, "p"), temperature)
    return (1.0 - exit_probability) ** cycles


def thinking_budget_manifest(facts: dict[str, object], max_tokens: int = 800) -> JsonObject:
    """Ground truth of gemma4-thinking-budget."""
    cycles = _exit_budget(
        max_tokens,
        int(_number(facts, "before_loop_tokens")),
        int(_number(facts, "cycle_tokens")),
        int(_number(facts, "after_exit_tokens")),
    )

    def rates(limit: int) -> dict[str, float]:
        return {
            "temperature_0": 1.0,
            "temperature_1": loop_failure_rate(facts, limit, 1.0),
            "temperature_0.8": loop_failure_rate(facts, limit, 0.8),
        }

    return {
        "parameters": {
            **facts,
            "max_tokens": max_tokens,
            "cycles_that_fit": cycles,
            "failure_rate": rates(max_tokens),
            # What a token-limit probe (max_tokens x4) should see: fewer failures at T>0,
            # still all at T=0 -- raising the limit does not fix a loop.
            "failure_rate_at_4x_max_tokens": rates(4 * max_tokens),
            "failure_rate_formula": "(1 - p_T) ** cycles_that_fit, p_T = p after temperature",
        },
        "causes": {
            "reasoning-exhausts-budget": _cause(
                True,
                "confirmed",
                ["confirmed"],
                "Thinking is on by default; the thought loops and eats max_tokens: "
                "finish_reason length, content empty. enable_thinking=false (or a reasoning "
                "budget) gives the full answer and a stop.",
            ),
            "speculative-decoding": _cause(
                False,
                "not-confirmed",
                ["rejected", "suspected"],
                "The draft model changes which tokens are proposed, not the distribution "
                "the target samples from: the spec-off server fails at the same rate.",
            ),
            "quantized-weights": _cause(
                False,
                "rejected",
                ["rejected"],
                "qat (Q4_0) and mxfp4 (MXFP4) hold the same chain and the same template: "
                "identical behaviour.",
            ),
            "server-build": _cause(
                False,
                "suspected",
                ["suspected"],
                "Not testable: the drill has one build. An alternate binary would decide it.",
            ),
            "output-parsing": _cause(
                False,
                "not-confirmed",
                ["rejected", "suspected"],
                "The output is parsed correctly: the thought is reasoning_content, the "
                "answer content; the empty content is a length stop.",
            ),
            "token-limit": _cause(
                False,
                "not-confirmed",
                ["rejected", "suspected"],
                f"With thinking off the {facts['answer_chars']}-char answer needs "
                f"{int(_number(facts, 'answer_tokens')) + 1} tokens and stops well inside "
                f"max_tokens={max_tokens}.",
            ),
        },
    }


def toolcall_manifest(facts: dict[str, object]) -> JsonObject:
    """Ground truth of gemma4-toolcall."""
    q = _number(facts, "q")
    return {
        "parameters": {
            **facts,
            "failure_rate": {
                "temperature_0": 0.0,
                "temperature_1": q,
                "temperature_0.8": sampled_probability(q, 0.8),
            },
        },
        "causes": {
            "output-parsing": _cause(
                True,
                "confirmed",
                ["confirmed"],
                "With probability q the model writes the tool call inside its thought, "
                "with unquoted arguments: the markup lands in reasoning_content (or the "
                "response fails to parse), no tool_calls, empty content, finish stop.",
            ),
            "reasoning-exhausts-budget": _cause(
                False,
                "not-confirmed",
                ["rejected", "suspected"],
                "Thinking off removes the symptom, but the failing responses stop "
                "(finish_reason stop), they do not run out of tokens.",
            ),
            "speculative-decoding": _cause(
                False,
                "not-confirmed",
                ["rejected", "suspected"],
                "The spec-off server fails at the same rate.",
            ),
            "quantized-weights": _cause(
                False,
                "rejected",
                ["rejected"],
                "qat and mxfp4 hold the same chain and template.",
            ),
            "server-build": _cause(
                False,
                "suspected",
                ["suspected"],
                "Not testable: the drill has one build.",
            ),
            "token-limit": _cause(
                False,
                "rejected",
                ["rejected", "suspected"],
                "Responses are short and never stop on length.",
            ),
        },
    }


def expected_reasoning_chars(design: Design, max_tokens: int) -> int:
    """Length of reasoning_content of a greedy run cut at max_tokens (thought never closes)."""
    vocab = design.vocab
    path = design.greedy_path(vocab.byte(0x0A), max_tokens)
    text = design.text_of(path)
    prefix = "<|channel>thought"
    assert text.startswith(prefix)
    return len(text[len(prefix) :].lstrip())


def chars_per_token(text: str, tokens: int) -> float:
    """Average characters per token (for reports)."""
    return len(text) / tokens if tokens else math.nan
