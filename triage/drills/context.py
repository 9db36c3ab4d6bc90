"""The `context-size` drill: an answer longer than the server's per-slot context.

A Gemma 4 drill (official template, thinking on by default) whose model thinks one short
sentence, then writes a ~370-token harbour log and ends its turn. The incident server runs
`-c 1024 -np 4`: 256 tokens per slot, so every reply stops at the context end with
`finish_reason: length` long before the request's max_tokens (1024). What tells the cause
apart, exactly as on a real model:

* max_tokens x4 changes nothing (the context, not max_tokens, stops the reply);
* thinking off changes nothing (the answer alone does not fit);
* the same server with `-c 4096 -np 4` (1024 tokens per slot) lets it finish (`stop`).

The `context-shift` cause has no drill of its own, honestly: a drill model is a
first-order Markov chain, so what it writes depends only on its last token, never on the
context that a context shift discards. Turning context shift off can therefore only end a
generation earlier (at the context end) and never turn a failing reply into a good one;
the real-world mechanism (a model that loses its prompt after the shift and then loops)
cannot be designed on a 1-layer drill. Its rule is covered by unit tests instead, and this
drill checks that it is not confirmed here.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from triage.drills import gemma4
from triage.drills.compiler import WEIGHT_FORMATS, compile_design
from triage.drills.host import host_workaround_args, host_workaround_note
from triage.drills.language import Design
from triage.llama.build import BUILD_NUMBER

if TYPE_CHECKING:
    from triage.drills.registry import Drill

NAME = "context-size"
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


def context_size_design() -> tuple[Design, dict[str, Any]]:
    """Think one sentence, then the whole log, then end the turn; thinking off: the log."""
    design = gemma4._base_design("context-size")
    vocab = design.vocab
    thought = design.words(design.chunks(THOUGHT, gemma4.REASONING_PIECE))
    answer = design.words(design.chunks(LOG, gemma4.ANSWER_PIECE))
    channel_end, turn_end = vocab.id("<channel|>"), vocab.id("<turn|>")
    design.link([*gemma4._opening(design), *thought, channel_end, *answer, turn_end])
    facts = {
        "thought_tokens": len(thought),
        "answer_tokens": len(answer),
        "answer_chars": len(LOG),
        "generated_tokens": 2 + len(thought) + 1 + len(answer) + 1,
        "n_ctx_slot": INCIDENT_CONTEXT // SLOTS,
        "n_ctx_slot_at_4x": 4 * INCIDENT_CONTEXT // SLOTS,
        "max_tokens": MAX_TOKENS,
    }
    return design, facts


def _cause(expected: str, accept: list[str], why: str) -> dict[str, Any]:
    return {"real": expected == "confirmed", "expected": expected, "accept": accept, "why": why}


def manifest_causes(facts: dict[str, Any]) -> dict[str, Any]:
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


def build(out_dir: Path, template: str) -> Drill:
    """Generate the drill (model, manifest, request, stack.toml) into `out_dir`."""
    from triage.drills.registry import MANIFEST_VERSION, Drill, _sha256

    out_dir.mkdir(parents=True, exist_ok=True)
    design, facts = context_size_design()
    model = compile_design(
        design,
        out_dir / f"{NAME}-qat.gguf",
        weight_format=WEIGHT_FORMAT,
        chat_template=template,
        model_name=f"{NAME}-qat",
    )
    host_args = host_workaround_args()
    host_note = host_workaround_note() if host_args else None
    server_args = [*SERVER_ARGS, *host_args]
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
    manifest: dict[str, Any] = {
        "manifest_version": MANIFEST_VERSION,
        "drill": NAME,
        "designed_for_build": BUILD_NUMBER,
        "vocab_size": len(design.vocab),
        "models": {
            "qat": {
                "file": model.name,
                "format": WEIGHT_FORMAT,
                "file_type": WEIGHT_FORMATS[WEIGHT_FORMAT].file_type.name,
                "sha256": _sha256(model),
                "bytes": model.stat().st_size,
            }
        },
        "server_args": server_args,
        "host_workaround": host_note,
        "parameters": facts,
        "causes": manifest_causes(facts),
        "requests": [
            {
                "name": "greedy",
                "role": "failing",
                "file": "request-greedy.json",
                "expect": {"finish_reason": "length", "failure_rate": 1.0},
            },
            {
                "name": "long-prompt",
                "role": "failing",
                "file": "request-long-prompt.json",
                "expect": {
                    "status": 400,
                    "error_type": "exceed_context_size_error",
                    "failure_rate": 1.0,
                },
            },
        ],
    }
    (out_dir / "request-greedy.json").write_text(json.dumps(request, indent=2) + "\n")
    (out_dir / "request-long-prompt.json").write_text(json.dumps(long_prompt, indent=2) + "\n")
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    lines = [
        f"# Drill {NAME}: generated by triage.drills; ground truth in manifest.json",
        *([f"# {host_note} -- added for this drill, not part of the incident"] * bool(host_note)),
        "[server]",
        f"model = {json.dumps(model.name)}",
        f"args = {json.dumps(server_args)}",
        "",
    ]
    (out_dir / "stack.toml").write_text("\n".join(lines))
    requests = [request, long_prompt]
    return Drill(NAME, out_dir, {"qat": model}, manifest, requests, server_args, {}, host_note)
