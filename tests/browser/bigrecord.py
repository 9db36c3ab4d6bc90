"""A diagnosed incident the size of a real engine run (3 symptoms, 16 causes, 12 probe arms
each deciding causes, a decision) as an incident file, for the cause-graph tests."""

from __future__ import annotations

from typing import Any

SLUG = "2026-11-30-large-diagnosis"
STATUSES = ("confirmed", "rejected", "suspected", "rejected")
CATALOGUE = (
    "reasoning-exhausts-budget",
    "speculative-decoding",
    "quantized-weights",
    "server-build",
    "output-parsing",
    "token-limit",
)
ARMS = (
    "thinking-off",
    "reasoning-budget",
    "token-limit-x4",
    "spec-off",
    "alt-build",
    "alt-weights",
    "kv-f16",
    "ctx-x2",
    "no-tools",
    "temperature-0",
    "single-slot",
    "cpu-only",
)


def record() -> dict[str, Any]:
    evidence = []
    for i, arm in enumerate(ARMS, start=1):
        evidence.append(
            {
                "id": f"E{i}",
                "kind": "measurement",
                "summary": f"probe arm {arm}: {i}/16 failed",
                "recorded_at": "2026-11-30T10:00:00Z",
                "payload": {
                    "type": "arm",
                    "arm": arm,
                    "n": 16,
                    "failures": i,
                    "decision": "removes" if i % 4 == 1 else "unchanged",
                },
            }
        )
    causes = []
    for i in range(16):
        status = STATUSES[i % 4]
        arm = (i % len(ARMS)) + 1
        causes.append(
            {
                "id": f"cause-{i:02d}",
                "catalogue": CATALOGUE[i % len(CATALOGUE)],
                "title": f"Cause number {i} with a title as long as the catalogue's are",
                "status": status,
                "basis": "untested" if status == "suspected" else "measured",
                "rationale": f"decided by arm {ARMS[arm - 1]}",
                "deciding_probe": ARMS[arm - 1],
                "evidence": []
                if status == "suspected"
                else [
                    {
                        "id": f"E{arm}",
                        "relation": "supports" if status == "confirmed" else "refutes",
                    }
                ],
            }
        )
    return {
        "slug": SLUG,
        "title": "A large diagnosis: many causes and probe arms",
        "status": "open",
        "opened": "2026-11-30",
        "summary": "a diagnosed incident with a large cause graph",
        "symptoms": [
            {"id": kind, "kind": kind, "description": f"{kind} in the failing replies"}
            for kind in ("empty-content", "length-stop", "reasoning-exhausted-budget")
        ],
        "causes": causes,
        "evidence": evidence,
        "body": "",
    }
