"""prompt-cache: llama-server's prompt cache is why the failure happens. Two variants:

* a cache bug on restore: replies fail only when the prompt is restored from the slot's
  cache -- decided by the `cache-as-client` observation (triage/engine/arms/cache_as_client.py:
  the request with the cache on, restored from one slot) against the baseline, whose replays
  all send `cache_prompt: false`;
* latency: a conversation whose prompt begins with a value the client renders anew every turn
  (a timestamp first in the system prompt, a request id) reuses nothing of the slot's cache,
  so every turn re-evaluates the whole prompt and the latency grows with the history --
  decided by the `prompt-cache-turns` observation (triage/engine/arms/prompt_cache.py): the
  captured conversation replayed turn by turn on one slot with the cache on, the volatile
  value re-rendered per turn (as the client does) vs held fixed.

  confirmed  cache on reproduces the failure (the baseline rule's share) and the cache-off
             baseline removes it (Fisher, p < 0.05); or the captured turn took (almost)
             nothing from the cache (its timings: the unstable-prefix reading), re-rendered
             per turn the later turns reuse nothing (the reproduction, never one sample),
             and held fixed they reuse the prompt (the engine's test, p < 0.05);
  rejected   with the cache off the baseline reproduces the failure (the cache is not needed
             for it); the client turned the cache off; the captured turn reused its prefix;
             or held fixed the turns still reuse nothing;
  suspected  otherwise: a failure neither the cache-off baseline nor the cache-on replays
             reproduce (untested), a continuation that reused
             nothing with no volatile value found (capture consecutive turns: the sequence
             reading -- `triage diagnose` on a capture of those turns -- says where they
             differ), or a replay that does not reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from triage.causes import (
    ArmOutcome,
    CauseRule,
    Observations,
    Verdict,
    baseline_of,
    reproduces,
    suspect,
)
from triage.checks.prefix import UNSTABLE_CACHED_SHARE
from triage.engine.arms.cache_as_client import ARM as CACHE_ARM
from triage.engine.arms.prompt_cache import ARM
from triage.stats import baseline_reproduces, compare, wilson

ID = "prompt-cache"


def _kn(k: int, n: int) -> str:
    ci = wilson(k, n)
    return f"{k}/{n} (95% CI {ci.low:.2f}-{ci.high:.2f})"


def _rejected(why: str, deciding: str) -> Verdict:
    return Verdict(ID, "rejected", why, refutes=[deciding], deciding_probe=deciding)


def _captured_text(captured: Mapping[str, Any] | None) -> str:
    if not captured:
        return "the capture has no timings.cache_n"
    total = int(captured["cache_n"]) + int(captured["prompt_n"])
    spent = captured.get("prompt_ms")
    ms = f" in {spent:.0f} ms" if isinstance(spent, (int, float)) else ""
    return (
        f"the captured turn took {captured['cache_n']} of its {total} prompt tokens from the "
        f"cache and evaluated {captured['prompt_n']}{ms}"
    )


def _reused(captured: Mapping[str, Any] | None) -> bool:
    if not captured:
        return False
    total = int(captured["cache_n"]) + int(captured["prompt_n"])
    return total > 0 and int(captured["cache_n"]) >= UNSTABLE_CACHED_SHARE * total


def _replay_verdict(facts: Mapping[str, Any]) -> Verdict:
    volatile, replay = facts["volatile"], facts.get("replay") or {}
    client, held = replay.get("as_client") or {}, replay.get("held") or {}
    n = min(int(client.get("n") or 0), int(held.get("n") or 0))
    value = f"the {volatile['kind']} {volatile['text']!r} at {volatile['where']} char " + str(
        volatile["offset"]
    )
    captured = _captured_text(facts.get("captured"))
    k_client, k_held = int(client.get("reuse_nothing") or 0), int(held.get("reuse_nothing") or 0)
    both = (
        f"re-rendered every turn {_kn(k_client, n)} later turns reuse nothing (median cache_n "
        f"{client.get('median_cache_n')}, prompt {client.get('median_prompt_ms')} ms), held "
        f"fixed {_kn(k_held, n)} (median cache_n {held.get('median_cache_n')}, prompt "
        f"{held.get('median_prompt_ms')} ms)"
    )
    if n == 0 or not baseline_reproduces(k_client, n):
        return suspect(
            ID,
            f"{captured}, but with {value} re-rendered every turn the replayed turns still "
            f"reuse the cache ({both}): the value is not what changes the prefix",
            "capture consecutive turns of the conversation and diagnose that capture (its "
            "unstable-prefix finding names where their prompts differ)",
            basis="untested",
        )
    decision = replay.get("decision")
    if decision == "unchanged":
        return _rejected(
            f"{captured}; {both}: the turns reuse nothing even with the value held, so it is "
            "not the prefix that changes",
            ARM,
        )
    if decision != "removes":
        return suspect(ID, f"undecided: {both}", f"{ARM} with more rounds")
    p = replay.get("p_value")
    return Verdict(
        ID,
        "confirmed",
        f"{captured}; {value} begins to change every turn as the client renders it: replayed "
        f"turn by turn on one slot with the cache on, {both}"
        + (f" (p={p:.2g})" if isinstance(p, (int, float)) else "")
        + "; move what changes every turn to the end of the prompt (e.g. the last user "
        "message)",
        supports=[ARM],
        deciding_probe=ARM,
    )


def _cache_on_verdict(base: ArmOutcome, cache_on: Mapping[str, Any]) -> Verdict | None:
    """The cache-as-client replays (cache on, restored from one slot) against the cache-off
    baseline; None when they did not run or do not reproduce the failure."""
    n, k = int(cache_on.get("n") or 0), int(cache_on.get("failures") or 0)
    if not cache_on.get("ran") or not baseline_reproduces(k, n) or base.n == 0:
        return None
    on, off = _kn(k, n), base.kn()
    kinds = ", ".join(cache_on.get("kinds") or {}) or "failures"
    result = compare(k, n, base.failures, base.n, looks=1)
    if result.decision == "removes":
        return Verdict(
            ID,
            "confirmed",
            f"with the prompt cache as the client had it (on, the prompt restored from one "
            f"slot) {on} replays fail ({kinds}); with it off (the baseline) {off} "
            f"(p={result.p_less:.2g}): the failure needs the cache -- a cache bug on restore",
            supports=[CACHE_ARM, "baseline"],
            deciding_probe=CACHE_ARM,
        )
    return suspect(
        ID,
        f"undecided: cache on {on} vs off {off}",
        f"{CACHE_ARM} and the baseline with more replays",
    )


def rule(arms: Mapping[str, ArmOutcome], obs: Observations) -> Verdict:
    base = baseline_of(arms)
    if reproduces(arms):
        return _rejected(
            f"with the prompt cache off (every replay sends cache_prompt: false) the baseline "
            f"reproduces the failure ({base.kn()}): the cache is not needed for it",
            "baseline",
        )
    facts = obs.facts.get(ARM)
    if not facts or facts.get("error"):
        why = (facts or {}).get("error") or f"the {ARM} observation did not run"
        return suspect(ID, str(why), ARM, basis="untested")
    if facts.get("cache_off"):
        return _rejected(
            "the client turned the prompt cache off (cache_prompt: false): nothing was reused "
            "or restored",
            "request",
        )
    cache_on = obs.facts.get(CACHE_ARM) or {}
    restored = _cache_on_verdict(base, cache_on)
    if restored is not None:
        return restored
    if not facts.get("continuation"):
        tried = "; no failing captured reply to replay with the cache on"
        if cache_on.get("ran"):
            on = _kn(int(cache_on["failures"]), int(cache_on["n"]))
            tried = f"; with the cache on, restored from one slot: {on} replays fail"
        return suspect(
            ID,
            "one request, not a conversation, and the cache-off baseline does not reproduce "
            f"the failure ({base.kn()}){tried}",
            f"{CACHE_ARM} (the request with the cache on, restored from one slot)",
            basis="untested",
        )
    captured = facts.get("captured")
    if _reused(captured):
        return _rejected(f"{_captured_text(captured)}: its prefix was reused", "capture")
    if not facts.get("volatile"):
        return suspect(
            ID,
            f"{_captured_text(captured)}, and no value that changes every turn (a time, date, "
            "id) is in the first message; a slot that held another conversation, or a prefix "
            "changed elsewhere, reads the same",
            "capture consecutive turns of the conversation and diagnose that capture (its "
            "unstable-prefix finding names where their prompts differ)",
            basis="untested",
        )
    return _replay_verdict(facts)


CAUSE = CauseRule(
    id=ID,
    number=21,
    title="Prompt cache (a prompt prefix that changes every turn reuses nothing)",
    mechanism="llama-server's prompt cache reuses only the part of a new prompt that matches "
    "the slot's last one from its first token; a value the client renders anew every turn "
    "at the start (a timestamp first in the system prompt, a request id) makes every turn "
    "re-evaluate the whole prompt, so latency grows with the conversation",
    decided_by=f"the {CACHE_ARM} observation (cache on, restored from one slot) against the "
    f"cache-off baseline; for latency, the {ARM} observation (the conversation turn by turn "
    "on one slot, cache on, the value re-rendered vs held)",
    rule=rule,
    retrospective="the prompt began with a value the client changed every turn (e.g. a "
    "timestamp first in the system prompt), so llama-server's prompt cache reused nothing "
    "and every turn re-evaluated the whole conversation; held fixed (or moved to the end) "
    "the cache reused it",
)


def register(catalogue: Any) -> None:
    catalogue.causes.add(CAUSE)
