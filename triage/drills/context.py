"""The context drills: `context-size` (an answer longer than the per-slot context) and
`context-shift` (a loop that never ends on a server with context shift on).

Both are Gemma 4 drills (official template, thinking on by default) whose model thinks one
short sentence and then answers; both servers run `-c 1024 -np 4`: 256 tokens per slot.

`context-size`: the answer is a ~310-token harbour log, so every reply stops at the slot
end with `finish_reason: length` long before the request's max_tokens (1024), and a second
request whose pasted note alone is longer than the slot is refused with HTTP 400 "exceeds
the available context size". Exactly as on a real model: max_tokens x4 and thinking off
change nothing; the same server with `-c 4096 -np 4` (1024 per slot) lets both finish.

`context-shift`: the answer loops at temperature 0 (a cycle of tokens, no end of turn); the
request has no max_tokens and the server runs `--context-shift`. llama-server b11434 then
never ends the reply (measured: ~900 shifts in 6 s, no answer): the replay times out, the
engine records a hung server and diagnoses it one launch per replay. With
`--no-context-shift` the same reply ends at the slot end (finish `length`, the loop
flagged by `repetition-to-context-end`). What is honest about it: a drill is a first-order
Markov chain, so what it writes never depends on the context the shift discards; the drill
shows the part of the real incident that a Markov chain can show -- a request without
max_tokens that never ends because of context shift -- not a model that starts looping
because the shift dropped its prompt. The loop itself is the model's; the cause confirmed
is the never-ending generation. The replay timeout (`manifest.json` `replay_timeout`) stands
in for the user's patience.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypedDict

from kb.jsontypes import JsonObject
from triage.drills import gemma4
from triage.drills.compiler import compile_design
from triage.drills.drill import Drill, ExpectedCause, manifest_head, weight_facts
from triage.drills.host import host_workaround_args, host_workaround_note
from triage.drills.language import Design

NAME = "context-size"
SHIFT_NAME = "context-shift"
PROMPT = "Write the full harbour log for this morning, every entry."
THOUGHT = "\nThe user wants every log entry. I will write them all in order."
# The answer: distinct sentences (a token has one successor, so no text may repeat).
LOG = (
    "05:12 Harbour master on duty; wind light from the south-west, sea calm, visibility "
    "good beyond the outer mole. 05:20 Pilot boat Kestrel left the inner basin for the "
    "fairway buoy to meet the coaster Maren Holt, inbound with timber. 05:34 Lighthouse "
    "lamp switched to day mode by the keeper; fog signal tested and found in order. "
    "05:41 Trawler Saint Bride requested fuel at the north quay; tanker lorry called. "
    "05:55 First ferry of the day, Island Star, loading cars at the linkspan; eighteen "
    "vehicles and two vans counted aboard. 06:03 Crane driver reported a sticking brake "
    "on crane three; engineer sent, crane taken out of service until checked. 06:10 "
    "Maren Holt passed the fairway buoy, pilot boarded from the starboard ladder without "
    "trouble. 06:18 Gulls nesting on the old signal tower again; notice sent to the "
    "warden about the spring survey. 06:26 Island Star sailed four minutes late after a "
    "ramp sensor fault; delay noted for the operator's report. 06:37 Diver team arrived "
    "for the hull inspection of the dredger Coldwater, berth six, moored since Friday. "
    "06:45 Tide turned; slack water at the bar expected around seven, depth gauge "
    "reading normal. 06:52 Maren Holt all fast at berth two, timber discharge planned "
    "after breakfast with both shore gangs. 07:04 Crane three brake adjusted and tested "
    "under load; returned to service by the engineer on watch. 07:15 Yacht Halcyon asked "
    "for a visitor mooring for three nights; allocated pontoon C, space eleven. 07:22 "
    "Fishing boats Ruby May and Northern Light landed their catch at the market steps. "
    "07:31 Customs officer boarded Maren Holt for the usual paperwork and crew list "
    "check. 07:40 Small oil sheen reported near the slipway; boom deployed, source "
    "traced to a leaking outboard on a dinghy. 07:48 Boom recovered, sheen gone; owner "
    "of the dinghy advised and the repair noted. 07:56 Weather update from the coast "
    "station: wind backing south, rising to force five by the afternoon. 08:05 Handover "
    "briefing prepared for the day shift; no vessels waiting outside, all berths "
    "accounted for, log closed for the morning watch."
)
# The second failing request: the same ask after a pasted note that alone is longer than
# the slot (text outside the drill vocabulary tokenizes to about one token per byte), so
# llama-server refuses it with HTTP 400 "exceeds the available context size".
PASTED_NOTE = (
    "Night watch note, pasted for context: quiet night, no arrivals after 23:40, the tug "
    "crew changed at 02:00, a loose fender on pontoon B was tied back at 03:15, the fuel "
    "berth light is out again and needs a new lamp, the visitor from the yacht club asked "
    "about winter storage prices, and the security patrol found the east gate unlocked at "
    "04:30 and locked it."
)
MAX_TOKENS = 1024
# 1024 tokens over 4 slots: 256 per slot, well below prompt + thought + answer (~440).
INCIDENT_CONTEXT = 1024
SLOTS = 4
SERVER_ARGS = ["-c", str(INCIDENT_CONTEXT), "-np", str(SLOTS), "-t", "1", "-tb", "1"]
WEIGHT_FORMAT = "Q4_0"
SHIFT_PROMPT = "Give me the tide table for the harbour."
SHIFT_THOUGHT = "\nThe user wants the tide table. I will list it."
TIDE_INTRO = "Tide table for the harbour:"
# One cycle of the loop: at temperature 0 its last token leads back to its first, forever.
TIDE_CYCLE = " high water at six, low water at noon, high water again at six,"
# A replay that has not ended after this many seconds is a hang (the user gave up).
REPLAY_TIMEOUT = 4.0


class ContextSizeFacts(TypedDict):
    """The designed numbers of the context-size drill (its manifest's `parameters`)."""

    thought_tokens: int
    answer_tokens: int
    answer_chars: int
    generated_tokens: int  # after the prompt: opening, thought, channel end, answer, turn end
    n_ctx_slot: int
    n_ctx_slot_at_4x: int
    max_tokens: int


class ContextShiftFacts(TypedDict):
    """The designed numbers of the context-shift drill (its manifest's `parameters`)."""

    cycle_tokens: int
    cycle_chars: int
    n_ctx_slot: int
    replay_timeout: float


def context_size_design() -> tuple[Design, ContextSizeFacts]:
    """Think one sentence, then the whole log, then end the turn; thinking off: the log."""
    design = gemma4._base_design("context-size")
    vocab = design.vocab
    thought = design.words(design.chunks(THOUGHT, gemma4.REASONING_PIECE))
    answer = design.words(design.chunks(LOG, gemma4.ANSWER_PIECE))
    channel_end, turn_end = vocab.id("<channel|>"), vocab.id("<turn|>")
    design.link([*gemma4._opening(design), *thought, channel_end, *answer, turn_end])
    facts: ContextSizeFacts = {
        "thought_tokens": len(thought),
        "answer_tokens": len(answer),
        "answer_chars": len(LOG),
        "generated_tokens": 2 + len(thought) + 1 + len(answer) + 1,
        "n_ctx_slot": INCIDENT_CONTEXT // SLOTS,
        "n_ctx_slot_at_4x": 4 * INCIDENT_CONTEXT // SLOTS,
        "max_tokens": MAX_TOKENS,
    }
    return design, facts


def _cause(expected: str, accept: list[str], why: str) -> ExpectedCause:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes(facts: ContextSizeFacts) -> dict[str, ExpectedCause]:
    """Expected verdicts: context-size confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    return {
        "context-size": _cause(
            "confirmed",
            ["confirmed"],
            f"The reply needs ~{facts['generated_tokens']} tokens after the prompt; the slot "
            f"holds {facts['n_ctx_slot']}: every reply stops on length at the context end. "
            f"With -c x4 the slot holds {facts['n_ctx_slot_at_4x']} and the reply stops.",
        ),
        "context-shift": _cause(
            "not-confirmed",
            not_confirmed,
            "The request sets max_tokens and the server does not enable context shift.",
        ),
        "reasoning-exhausts-budget": _cause(
            "not-confirmed",
            not_confirmed,
            "The thought is one sentence; thinking off fails the same way.",
        ),
        "speculative-decoding": _cause(
            "not-confirmed", not_confirmed, "The server has no speculative decoding."
        ),
        "quantized-weights": _cause(
            "suspected", ["suspected"], "Not testable: the drill has no alternate weights."
        ),
        "server-build": _cause(
            "suspected", ["suspected"], "Not testable: the drill has one build."
        ),
        "output-parsing": _cause(
            "not-confirmed",
            not_confirmed,
            "The output is parsed correctly; the reply is cut by the context.",
        ),
        "token-limit": _cause(
            "not-confirmed",
            not_confirmed,
            f"max_tokens x4 ({4 * MAX_TOKENS}) changes nothing: the context stops the reply.",
        ),
    }


def _write(
    name: str,
    design: Design,
    out_dir: Path,
    template: str,
    server_args: list[str],
    manifest: JsonObject,
    requests: list[JsonObject],
) -> Drill:
    """Compile the model, write request files, manifest.json and stack.toml."""
    out_dir.mkdir(parents=True, exist_ok=True)
    model = compile_design(
        design,
        out_dir / f"{name}-qat.gguf",
        weight_format=WEIGHT_FORMAT,
        chat_template=template,
        model_name=f"{name}-qat",
    )
    host_args = host_workaround_args()
    host_note = host_workaround_note() if host_args else None
    server_args = [*server_args, *host_args]
    full: JsonObject = {  # manifest.json as written
        **manifest_head(name),
        "vocab_size": len(design.vocab),
        "models": {
            "qat": {
                **weight_facts(model, WEIGHT_FORMAT),
                "bytes": model.stat().st_size,
            }
        },
        "server_args": server_args,
        "host_workaround": host_note,
        **manifest,
    }
    for described, body in zip(full["requests"], requests, strict=True):
        described["file"] = f"request-{described['name']}.json"
        (out_dir / described["file"]).write_text(json.dumps(body, indent=2) + "\n")
    (out_dir / "manifest.json").write_text(json.dumps(full, indent=2) + "\n")
    lines = [
        f"# Drill {name}: generated by triage.drills; ground truth in manifest.json",
        *([f"# {host_note} -- added for this drill, not part of the incident"] * bool(host_note)),
        "[server]",
        f"model = {json.dumps(model.name)}",
        f"args = {json.dumps(server_args)}",
        "",
    ]
    (out_dir / "stack.toml").write_text("\n".join(lines))
    return Drill(name, out_dir, {"qat": model}, full, requests, server_args, {}, host_note)


def build(out_dir: Path, template: str) -> Drill:
    """Generate the context-size drill into `out_dir`."""
    design, facts = context_size_design()
    request = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": MAX_TOKENS,
        "temperature": 0.0,
        "seed": 42,
    }
    long_prompt = {
        **request,
        "messages": [{"role": "user", "content": f"{PASTED_NOTE}\n\n{PROMPT}"}],
    }
    manifest: JsonObject = {
        "parameters": facts,
        "causes": manifest_causes(facts),
        "requests": [
            {
                "name": "greedy",
                "role": "failing",
                "expect": {"finish_reason": "length", "failure_rate": 1.0},
            },
            {
                "name": "long-prompt",
                "role": "failing",
                "expect": {
                    "status": 400,
                    "error_type": "exceed_context_size_error",
                    "failure_rate": 1.0,
                },
            },
        ],
    }
    return _write(NAME, design, out_dir, template, SERVER_ARGS, manifest, [request, long_prompt])


def context_shift_design() -> tuple[Design, ContextShiftFacts]:
    """Think one sentence, open the tide table, then loop over one cycle for ever."""
    design = gemma4._base_design(SHIFT_NAME)
    vocab = design.vocab
    thought = design.words(design.chunks(SHIFT_THOUGHT, gemma4.REASONING_PIECE))
    intro = design.words(design.chunks(TIDE_INTRO, gemma4.ANSWER_PIECE))
    cycle = design.words(design.chunks(TIDE_CYCLE, gemma4.ANSWER_PIECE))
    channel_end = vocab.id("<channel|>")
    design.link([*gemma4._opening(design), *thought, channel_end, *intro, *cycle])
    design.set(cycle[-1], {cycle[0]: 1.0})
    facts: ContextShiftFacts = {
        "cycle_tokens": len(cycle),
        "cycle_chars": len(TIDE_CYCLE),
        "n_ctx_slot": INCIDENT_CONTEXT // SLOTS,
        "replay_timeout": REPLAY_TIMEOUT,
    }
    return design, facts


def shift_manifest_causes() -> dict[str, ExpectedCause]:
    """Expected verdicts: context-shift confirmed, no other cause confirmed."""
    not_confirmed = ["rejected", "suspected"]
    return {
        "context-shift": _cause(
            "confirmed",
            ["confirmed"],
            "No max_tokens, --context-shift, a loop at temperature 0: the reply never ends "
            "(every replay hangs). With --no-context-shift it ends at the slot end.",
        ),
        "context-size": _cause(
            "not-confirmed",
            not_confirmed,
            "Four times the context with context shift still on: the reply still never ends.",
        ),
        "reasoning-exhausts-budget": _cause(
            "not-confirmed", not_confirmed, "The thought is one sentence and ends."
        ),
        "speculative-decoding": _cause(
            "not-confirmed", not_confirmed, "The server has no speculative decoding."
        ),
        "quantized-weights": _cause(
            "suspected", ["suspected"], "Not testable: the drill has no alternate weights."
        ),
        "server-build": _cause(
            "suspected", ["suspected"], "Not testable: the drill has one build."
        ),
        "output-parsing": _cause(
            "not-confirmed", not_confirmed, "Nothing to parse: no reply ever completes."
        ),
        "token-limit": _cause(
            "not-confirmed", not_confirmed, "The request sets no max_tokens to raise."
        ),
    }


def build_shift(out_dir: Path, template: str) -> Drill:
    """Generate the context-shift drill into `out_dir`."""
    design, facts = context_shift_design()
    request = {"messages": [{"role": "user", "content": SHIFT_PROMPT}], "temperature": 0.0}
    manifest: JsonObject = {
        "parameters": facts,
        "replay_timeout": REPLAY_TIMEOUT,
        "causes": shift_manifest_causes(),
        "requests": [
            {
                "name": "unbounded",
                "role": "failing",
                "expect": {"never_ends": True, "failure_rate": 1.0},
            }
        ],
    }
    args = [*SERVER_ARGS, "--context-shift"]
    return _write(SHIFT_NAME, design, out_dir, template, args, manifest, [request])
