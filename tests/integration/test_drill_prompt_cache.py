"""unstable-prefix on the real llama-server: a conversation replayed turn by turn with the prompt
cache on (as clients have it) reuses the prompt when its beginning is stable -- timings.cache_n
grows with the conversation -- and reuses nearly nothing when a timestamp comes first in the
system prompt; the second is an unstable-prefix finding, per exchange (cache_n) and over the
sequence (shared prefix), the first is not."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import pytest

from triage.capture import exchange_from_http
from triage.checks.prefix import sequence_findings
from triage.drills import build_drill
from triage.drills.host import host_workaround_args
from triage.symptoms import classify

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

POLICY = "You are a helpful assistant. Follow the house rules carefully. " * 25
TURNS = 4


def _converse(base_url: str, system: Any) -> list[dict[str, Any]]:
    exchanges: list[dict[str, Any]] = []
    messages: list[dict[str, Any]] = []
    with httpx.Client(base_url=base_url, timeout=120) as client:
        for turn in range(TURNS):
            messages.append({"role": "user", "content": f"Question {turn}: tell me about {turn}."})
            request = {
                "messages": [{"role": "system", "content": system(turn)}, *messages],
                "max_tokens": 4,
                "temperature": 0,
                "cache_prompt": True,
            }
            reply = client.post("/v1/chat/completions", json=request)
            assert reply.status_code == 200, reply.text
            body = reply.json()
            exchanges.append(exchange_from_http(request, body, status=200).to_dict())
            content = body["choices"][0]["message"].get("content") or "ok"
            messages.append({"role": "assistant", "content": content})
    return exchanges


def _cache_n(exchanges: list[dict[str, Any]]) -> list[int]:
    return [int(e["response"]["timings"]["cache_n"]) for e in exchanges]


def test_a_timestamp_first_defeats_the_prompt_cache_and_is_found(
    server_factory: Any, tmp_path: Path
) -> None:
    drill = build_drill("gemma4-thinking-budget", tmp_path / "drill")
    model = next(drill.out_dir.rglob("*.gguf"))
    args = ["-c", "8192", "-np", "1", "-t", "1", "-tb", "1", *host_workaround_args()]
    server = server_factory(model, args)

    stable = _converse(server.base_url, lambda turn: POLICY)
    stamped = _converse(server.base_url, lambda turn: f"Time: 17:{turn:02d}:07Z. " + POLICY)

    # Stable: every later turn takes at least the previous turn's prompt from the cache.
    stable_cached = _cache_n(stable)
    assert all(later > 500 for later in stable_cached[1:]), stable_cached
    assert stable_cached[1:] == sorted(stable_cached[1:])
    assert sequence_findings(stable) == []
    for exchange in stable[1:]:
        assert "unstable-prefix" not in {f.kind for f in classify(exchange) if not f.passed}

    # Timestamp first: the cache gives back only the few tokens before the timestamp.
    stamped_cached = _cache_n(stamped)
    assert all(later < 100 for later in stamped_cached[1:]), stamped_cached
    findings = sequence_findings(stamped)
    assert len(findings) == TURNS - 1
    assert all(f.where == f"$[{i + 1}].request.messages[0].content" for i, f in enumerate(findings))
    for exchange in stamped[1:]:
        assert "unstable-prefix" in {f.kind for f in classify(exchange) if not f.passed}
