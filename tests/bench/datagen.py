"""Benchmark data: a team's history of llama-server incidents with realistic text.

`generate(store, incidents=100_000, evidence=1_000_000)` writes incidents with symptoms
(finding kinds), causes (catalogue ids, statuses, rationales, status history, evidence
links), evidence (probe results, measurements, log lines with numbers), decisions and some
family links, in batches through kb.repo.bench_data (SQLAlchemy core executemany), then builds
the search index and family signatures. Deterministic for a given seed.

Also a script: `python tests/bench/datagen.py --url sqlite:///bench.db --incidents 10000`.
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Iterator
from datetime import date, datetime, timedelta, timezone
from typing import Any

from kb.repo.bench_data import Batch, empty_batch, load
from kb.repo.store import Store
from triage import symptoms
from triage.catalogue import catalogue
from triage.catalogue.numbering import vocabulary

# The built-in finding kinds in number order, and the causes of the first catalogue
# (numbers 0-5): the data set the published benchmark numbers were measured on.
FINDING_KINDS: tuple[str, ...] = symptoms.KINDS
CAUSE_CATALOGUE_IDS = tuple(
    cause.id for cause in sorted(catalogue().causes, key=lambda c: c.number) if cause.number < 6
)

MODELS = [
    ("gemma", ["gemma-3-27b-it", "gemma-4-31b-it", "gemma-4-12b-it", "gemma-3-4b-it"]),
    ("qwen", ["qwen3-30b-a3b", "qwen3-32b", "qwen2.5-coder-32b", "qwq-32b", "qwen3-8b"]),
    ("llama", ["llama-3.3-70b-instruct", "llama-3.1-8b-instruct", "codellama-34b"]),
    ("mistral", ["mistral-small-24b", "ministral-8b", "mistral-nemo-12b"]),
    ("deepseek", ["deepseek-r1-distill-qwen-32b", "deepseek-v3-lite"]),
    ("phi", ["phi-4", "phi-4-mini"]),
    ("gpt-oss", ["gpt-oss-20b", "gpt-oss-120b"]),
    ("glm", ["glm-4.5-air"]),
]
QUANTS = ["Q4_K_M", "Q5_K_M", "Q8_0", "Q4_0", "IQ4_XS", "MXFP4", "QAT-Q4", "Q6_K", "BF16"]
CLIENTS = ["Cline", "opencode", "Continue", "aider", "an internal agent", "the chat UI", "Echo"]
CHANGES = [
    "the weights were swapped from {q1} to {q2}",
    "llama.cpp was upgraded from b{b1} to b{b2}",
    "speculative decoding with a draft model was enabled",
    "draft-MTP speculative decoding was added",
    "the context size was raised to {ctx}",
    "--parallel was raised to {slots} slots",
    "the chat template was replaced",
    "the client started sending tools with strict schemas",
    "max_tokens was lowered to {max_tokens} in the client config",
    "the reasoning budget flag was removed",
]
SYMPTOM_TEXT = {
    "empty-content": [
        "responses come back with empty content",
        "{client} reports: empty or unparsable response from the model",
        "content is an empty string while reasoning_content is long",
    ],
    "length-stop": [
        "finish_reason is length on {pct}% of requests",
        "answers are cut off at max_tokens={max_tokens}",
    ],
    "reasoning-exhausted-budget": [
        "reasoning used {tokens} of {max_tokens} completion tokens and left no content",
        "the thinking channel eats the whole token budget",
    ],
    "runaway-reasoning": [
        "the model keeps thinking in a loop and never answers",
        "reasoning repeats the same draft over and over",
    ],
    "tool-args-invalid-json": [
        "tool-call arguments are not valid JSON: {error}",
        "{client} cannot parse the tool call arguments",
    ],
    "tool-args-schema-violation": [
        "tool arguments miss the required field {field}",
        "tool arguments have the wrong type for {field}",
    ],
    "tool-markup-leaked": [
        "raw tool-call markup shows up in the content",
        "the tool call lands in reasoning_content instead of tool_calls",
    ],
    "parse-failure": [
        "HTTP 500: the output does not match the expected peg-gemma4 format",
        "the chat parser fails on the model output",
    ],
    "truncated-stream": [
        "the SSE stream stops without data: [DONE]",
        "the stream is cut after {tokens} tokens",
    ],
    "http-error": ["HTTP {status} from llama-server", "the proxy returns {status} under load"],
    "timeout": [
        "requests time out after {seconds} s when all slots are busy",
        "{client} gives up after {seconds} s",
    ],
}
CAUSE_TEXT = {
    "reasoning-exhausts-budget": (
        "Thinking on by default eats the token budget",
        [
            "with enable_thinking false content_len={chars} and finish_reason=stop",
            "reasoning_len={reasoning} content_len=0 finish_reason=length on the failing request",
            "the template turns thinking on unless the request says otherwise",
        ],
    ),
    "speculative-decoding": (
        "Speculative decoding changes the committed tokens",
        [
            "spec off: {fail_off}/{n} failures vs {fail_on}/{n} with the draft model",
            "decode {tps1} -> {tps2} tok/s with draft acceptance {acc}%",
            "lossless means the distribution, not the exact token stream",
        ],
    ),
    "quantized-weights": (
        "The quantized weights made the model worse",
        [
            "deterministic A/B seed={seed}: ties on {k} prompts",
            "{q1} and {q2} answer the same on reasoning, code and fact prompts",
        ],
    ),
    "server-build": (
        "The llama.cpp build regressed",
        [
            "b{b1} fails {fail_on}/{n}, b{b2} fails {fail_off}/{n}",
            "the regression appeared between b{b1} and b{b2}",
        ],
    ),
    "output-parsing": (
        "The chat output parser mishandles the model's format",
        [
            "the PEG parser rejects the tool call; --jinja and the parser fix are needed",
            "tool-call data leaks into the reasoning field and content is empty",
        ],
    ),
    "token-limit": (
        "max_tokens is too low for the answer",
        [
            "raising max_tokens to {max_tokens2} fixes {fail_off}/{n}",
            "answers need about {tokens} tokens but the client sends {max_tokens}",
        ],
    ),
}
EVIDENCE_TEXT = [
    "probe {probe} n={n}: {fail}/{n} failures, 95% interval {lo}-{hi}%",
    "replay of the failing request: finish_reason={finish}, content_len={chars}, "
    "reasoning_len={reasoning}",
    "measured {tps1} tok/s decode, {pp} tok/s prompt processing at ctx {ctx}",
    "/props: build_info b{b1}, chat template hash {hash}",
    "/apply-template shows <|think|> in the system turn: thinking on by default",
    "server log: slot {slot} released after {tokens} tokens, n_draft_accepted={acc}",
    "{client} log: retry {k} of 10 after an empty response",
    "A/B {q1} vs {q2} seed={seed}: {k} ties, {w} wins",
    "SSE transcript: {tokens} deltas, last chunk finish_reason={finish}",
    "tool call arguments {error} at offset {offset}",
    "HTTP {status} after {ms} ms from the proxy",
    "determinism check: {k} of {n} streams identical at temperature 0",
]
DECISION_TEXT = {
    "PARKED": (
        "{model} is not core; revisit when {trigger}",
        "the fix costs {pct}% throughput",
    ),
    "FIXED": ("verified with {n} requests, 0 failures", "none measured"),
    "REOPENED": ("the failure came back after {trigger}", ""),
}
FIXES = [
    "--reasoning off on the server",
    "chat_template_kwargs enable_thinking false in the client",
    "removed --spec-type and the draft model",
    "rolled back to b{b1}",
    "max_tokens raised to {max_tokens2}",
    "updated to a build with the PEG parser fix and --jinja",
]
TRIGGERS = ["a new build ships", "new weights are released", "the failure rate exceeds 5%"]
# Words of the narrative text, most common first; drawn with Zipf-like weights (1/rank),
# so a few words are everywhere and most are rare, as in real incident write-ups.
FILLER = (
    "the a of and to in was on with for it that is we as at by after when not this from "
    "server model request response requests responses under load agent client retry "
    "retries token tokens content reasoning thinking budget empty tool call calls json "
    "arguments template chat stream build weights quantization speculative decoding draft "
    "slots context prompt output parser format error errors failure failures rate measured "
    "inferred rejected confirmed suspected probe probes replay baseline seed temperature "
    "greedy sampling latency throughput memory gpu cpu cache kv batch parallel queue proxy "
    "timeout gateway restart rollback upgrade downgrade release regression fix workaround "
    "flag default config configuration setting team call engineers logs metrics dashboard "
    "alert page incident postmortem retrospective lesson lessons decision parked fixed "
    "reopened closed revisit trigger trade-off cost speed quality accuracy answer answers "
    "paragraph code review refactor test tests suite harness benchmark eval evaluation "
    "korean english translation ocr vision image document dense layout table column "
    "session sessions window long short hour minute second day week night morning weekend "
    "deploy deployment rollout canary node host container docker kubernetes pod volume disk "
    "network socket connection keepalive header body payload field schema strict validation "
    "loop diverges repeats forever stops cut truncated partial leaked markup channel "
    "channel thought delimiter special control byte vocabulary tokenizer embedding layer "
    "head heads mtp acceptance accepted rejected verify verifies verification distribution "
    "stream identical divergent diverged deterministic nondeterministic flaky intermittent "
    "heavy light usage users user operator maintainer owner backlog ticket issue upstream "
    "patch commit bisect bisected version versions previous next known good bad worse "
    "better same different family pattern mechanism cause causes symptom symptoms evidence "
    "hypothesis hypotheses verdict unknown unmeasured unverified assumption assumptions"
).split()
SENTENCES = [
    "Retries usually succeeded, so nobody measured the failure rate at first.",
    "The failure showed only under heavy agent use with {slots} parallel slots.",
    "A single simple tool request worked {k}/{k} times.",
    "We changed three things at once, which made the cause hard to isolate.",
    "The first intuition was {probe}, and the measurement did not support it.",
    "{client} showed the error to the user and retried on its own.",
    "Rolling back to b{b1} was considered but not needed.",
    "The draft model accepted {acc}% of the proposed tokens.",
    "Decode speed went from {tps1} to {tps2} tokens per second.",
    "We kept the logs of both servers for {k} days.",
    "Turning thinking off server-side costs nothing in speed.",
    "The quantized weights answered the A/B prompts like the old ones.",
    "With temperature 0 and seed {seed} the run was repeatable.",
    "The parser needs --jinja for the tool calls of this template.",
    "Nobody recorded the exact build, only that it was recent.",
    "The budget of {max_tokens} tokens was used up by the reasoning.",
    "Content came back empty while reasoning_content held {reasoning} characters.",
    "The on-call engineer parked it because the model is not core.",
    "A revisit is due when {trigger}.",
    "Confirmed, inferred and rejected causes are kept apart in this record.",
]
_FILLER_WEIGHTS = [1.0 / (rank + 10) for rank in range(len(FILLER))]


class _Values(dict):  # type: ignore[type-arg]
    """Template values made on demand: a template pays only for the slots it has."""

    def __init__(self, text: _Text, extra: dict[str, Any]) -> None:
        super().__init__(extra)
        self.text = text

    def __missing__(self, key: str) -> Any:
        value = self.text.makers[key](self)
        self[key] = value
        return value


class _Text:
    """Template filling with random but plausible values."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        r = rng
        self.makers: dict[str, Callable[[_Values], Any]] = {
            "client": lambda v: r.choice(CLIENTS),
            "pct": lambda v: r.randint(1, 60),
            "max_tokens": lambda v: r.choice([256, 512, 800, 1024, 2048, 4096]),
            "max_tokens2": lambda v: r.choice([4096, 8192, 16384]),
            "tokens": lambda v: r.randint(100, 16000),
            "error": lambda v: r.choice(
                ["Expecting ',' delimiter", "Unterminated string", "Extra data", "invalid \\u"]
            ),
            "field": lambda v: r.choice(["path", "query", "line", "content", "command"]),
            "status": lambda v: r.choice([500, 502, 503, 504, 429]),
            "seconds": lambda v: r.choice([30, 60, 120, 600]),
            "chars": lambda v: r.randint(0, 3000),
            "reasoning": lambda v: r.randint(500, 9000),
            "n": lambda v: r.choice([8, 10, 20, 30, 40, 100]),
            "fail": lambda v: r.randint(0, v["n"]),
            "fail_on": lambda v: r.randint(0, v["n"]),
            "fail_off": lambda v: r.randint(0, v["n"]),
            "lo": lambda v: r.randint(0, 40),
            "hi": lambda v: r.randint(v["lo"] + 1, 100),
            "tps1": lambda v: round(r.uniform(5, 120), 1),
            "tps2": lambda v: round(r.uniform(5, 160), 1),
            "pp": lambda v: r.randint(100, 3000),
            "acc": lambda v: r.randint(30, 95),
            "seed": lambda v: r.choice([1, 7, 42, 1234]),
            "k": lambda v: r.randint(1, 9),
            "w": lambda v: r.randint(0, 4),
            "q1": lambda v: r.choice(QUANTS),
            "q2": lambda v: r.choice(QUANTS),
            "b1": lambda v: r.randint(4000, 11500),
            "b2": lambda v: v["b1"] + r.randint(1, 900),
            "ctx": lambda v: r.choice([4096, 8192, 32768, 131072]),
            "slots": lambda v: r.choice([2, 4, 8, 16]),
            "probe": lambda v: r.choice(
                ["thinking-off", "spec-off", "token-limit", "replay", "determinism", "alt-build"]
            ),
            "finish": lambda v: r.choice(["length", "stop", "tool_calls"]),
            "hash": lambda v: f"{r.getrandbits(32):08x}",
            "slot": lambda v: r.randint(0, 15),
            "offset": lambda v: r.randint(0, 400),
            "ms": lambda v: r.randint(100, 600_000),
            "trigger": lambda v: r.choice(TRIGGERS),
            "model": lambda v: r.choice(MODELS)[1][0],
        }

    def fill(self, template: str, **extra: Any) -> str:
        return template.format_map(_Values(self, extra))

    def filler(self, words: int) -> str:
        """About `words` words: stock sentences of write-ups, then Zipf-drawn words."""
        parts: list[str] = []
        count = 0
        while count < words // 2:
            sentence = self.fill(self.rng.choice(SENTENCES))
            parts.append(sentence)
            count += sentence.count(" ") + 1
        parts.append(" ".join(self.rng.choices(FILLER, _FILLER_WEIGHTS, k=words - count)))
        return " ".join(parts)


def _evidence_counts(rng: random.Random, incidents: int, evidence: int) -> list[int]:
    """How many evidence rows each incident gets: at least 1, summing to `evidence`."""
    counts = [1] * incidents
    extra = evidence - incidents
    for _ in range(max(extra, 0)):
        counts[rng.randrange(incidents)] += 1
    return counts


def batches(
    incidents: int = 100_000, evidence: int = 1_000_000, *, seed: int = 0, size: int = 2_000
) -> Iterator[Batch]:
    """Rows for every table, `size` incidents at a time, with explicit ids."""
    rng = random.Random(seed)
    text = _Text(rng)
    counts = _evidence_counts(rng, incidents, evidence)
    start_day = date(2023, 1, 1)
    evidence_id = cause_id = 0
    cause_ids_by_catalogue: dict[str, list[int]] = {c: [] for c in CAUSE_CATALOGUE_IDS}
    for first in range(0, incidents, size):
        batch = empty_batch()
        for incident_id in range(first + 1, min(first + size, incidents) + 1):
            family, names = rng.choice(MODELS)
            model = rng.choice(names)
            quant = rng.choice(QUANTS)
            build = rng.randint(4000, 11500)
            spec = rng.random() < 0.3
            thinking = rng.random() < 0.6
            opened = start_day + timedelta(days=rng.randrange(0, 3 * 365))
            at = datetime(opened.year, opened.month, opened.day, tzinfo=timezone.utc)
            kinds = rng.sample(FINDING_KINDS, rng.randint(1, 4))
            catalogue = rng.sample(CAUSE_CATALOGUE_IDS, rng.randint(1, 4))
            status = rng.choices(
                ["open", "parked", "fixed", "reopened", "closed"], [2, 2, 5, 1, 3]
            )[0]
            change = text.fill(rng.choice(CHANGES))
            symptom_phrase = text.fill(rng.choice(SYMPTOM_TEXT[kinds[0]]))
            title = f"{model} on llama-server: {symptom_phrase} after {change}"[:300]
            slug = f"{opened.isoformat()}-{model.replace('.', '-')}-{incident_id}"
            flags = ["--jinja", "-c", str(rng.choice([4096, 8192, 32768]))]
            if spec:
                flags += ["--spec-type", "draft-simple", "-md", f"{family}-draft.gguf"]
            if not thinking:
                flags += ["--reasoning", "off"]
            batch["incident"].append(
                {
                    "id": incident_id,
                    "slug": slug,
                    "title": title,
                    "opened_on": opened,
                    "closed_on": opened + timedelta(days=rng.randint(0, 30))
                    if status in ("fixed", "closed")
                    else None,
                    "status": status,
                    "summary": (
                        f"Under load from {text.fill('{client}')} {symptom_phrase}. Onset right "
                        f"after {change}. " + text.filler(25)
                    ),
                    "impact": text.fill(
                        "Agent sessions failed; retries succeeded {pct}% of the time."
                    ),
                    "model": model,
                    "weights": f"{model}-{quant}.gguf",
                    "server_build": f"b{build}",
                    "flags": flags,
                    "stack": {"thinking_default": thinking, "clients": [text.fill("{client}")]},
                    "timeline": [{"at": at.isoformat(), "event": f"{change}"}],
                    "body": "\n\n".join(
                        [
                            f"# {title}",
                            text.filler(60),
                            "## What we measured\n\n"
                            + text.fill(rng.choice(EVIDENCE_TEXT))
                            + ". "
                            + text.filler(40),
                            "## Lessons\n\n" + text.filler(30),
                        ]
                    ),
                    "source_file": "",
                    "created_at": at,
                    "updated_at": at,
                }
            )
            for index, kind in enumerate(kinds, 1):
                batch["symptom"].append(
                    {
                        "incident_id": incident_id,
                        "key": f"S{index}",
                        "kind": kind,
                        "description": text.fill(rng.choice(SYMPTOM_TEXT[kind])),
                        "observed": {},
                        "evidence_keys": [],
                    }
                )
            own_evidence = []
            for number in range(1, counts[incident_id - 1] + 1):
                evidence_id += 1
                own_evidence.append(evidence_id)
                batch["evidence"].append(
                    {
                        "id": evidence_id,
                        "incident_id": incident_id,
                        "key": f"E{number}",
                        "kind": rng.choice(["measurement", "probe", "observation", "log"]),
                        "summary": text.fill(rng.choice(EVIDENCE_TEXT)),
                        "payload": {"n": rng.randint(1, 40), "seed": rng.choice([1, 42])},
                        "source": "bench",
                        "recorded_at": at + timedelta(minutes=number),
                        "run_id": None,
                    }
                )
            for cause_number, catalogue_id in enumerate(catalogue):
                cause_id += 1
                cause_status = (
                    "confirmed"
                    if cause_number == 0 and status != "open"
                    else rng.choice(["suspected", "rejected", "confirmed"])
                )
                title_text, rationales = CAUSE_TEXT[catalogue_id]
                rationale = text.fill(rng.choice(rationales))
                batch["cause"].append(
                    {
                        "id": cause_id,
                        "incident_id": incident_id,
                        "key": catalogue_id,
                        "catalogue_id": catalogue_id,
                        "title": title_text,
                        "status": cause_status,
                        "basis": rng.choice(["measured", "inferred", "untested"]),
                        "rationale": rationale,
                        "deciding_probe": "",
                    }
                )
                batch["causestatuschange"].append(
                    {
                        "cause_id": cause_id,
                        "from_status": None,
                        "to_status": cause_status,
                        "changed_at": at,
                        "actor": "engine",
                        "rationale": rationale,
                        "evidence_keys": [],
                    }
                )
                for evidence_row in rng.sample(own_evidence, min(2, len(own_evidence))):
                    batch["evidencelink"].append(
                        {
                            "cause_id": cause_id,
                            "evidence_id": evidence_row,
                            "relation": rng.choice(["supports", "refutes", "context"]),
                            "note": "",
                        }
                    )
                if cause_status == "confirmed":
                    earlier = cause_ids_by_catalogue[catalogue_id]
                    if earlier and rng.random() < 0.05:
                        batch["familylink"].append(
                            {
                                "from_cause_id": cause_id,
                                "to_cause_id": rng.choice(earlier[-1000:]),
                                "note": "same failure family",
                                "created_at": at,
                            }
                        )
                    earlier.append(cause_id)
            if status != "open" and rng.random() < 0.8:
                kind = {"parked": "PARKED", "reopened": "REOPENED"}.get(status, "FIXED")
                rationale, tradeoff = DECISION_TEXT[kind]
                batch["decision"].append(
                    {
                        "incident_id": incident_id,
                        "kind": kind,
                        "decided_at": at + timedelta(days=1),
                        "decided_by": "on-call",
                        "rationale": text.fill(rationale, model=model),
                        "tradeoff": text.fill(tradeoff) if tradeoff else "",
                        "fix": text.fill(rng.choice(FIXES)) if kind == "FIXED" else "",
                        "verified": kind == "FIXED",
                        "revisit_on": None,
                        "revisit_triggers": [],
                        "evidence_keys": [],
                    }
                )
        yield batch


def generate(
    store: Store,
    incidents: int = 100_000,
    evidence: int = 1_000_000,
    *,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
) -> dict[str, float]:
    """Fill an empty store (see kb.repo.bench_data.load); seconds spent per phase."""
    return load(
        store,
        batches(incidents, evidence, seed=seed),
        progress=progress,
        vocabulary=vocabulary(catalogue()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", required=True, help="SQLAlchemy URL of an empty database")
    parser.add_argument("--incidents", type=int, default=100_000)
    parser.add_argument("--evidence", type=int, default=None, help="default 10 per incident")
    args = parser.parse_args()
    store = Store(args.url, migrate=False)
    started = time.perf_counter()
    try:
        timings = generate(
            store,
            args.incidents,
            args.evidence if args.evidence is not None else 10 * args.incidents,
            progress=print,
        )
    finally:
        store.close()
    print({**timings, "total_s": round(time.perf_counter() - started, 1)})


if __name__ == "__main__":
    main()
