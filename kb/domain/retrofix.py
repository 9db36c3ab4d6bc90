"""The "Fix options" of a retrospective: every probe arm that removed the failure, with
what it removed and what it costs in decode speed, side by side (issue 17: spec decoding
off removes the failure but gives up its speed -- a reader needs both numbers at once).

Pure: reads the arm measurements of an incident record (`payload.type == "arm"`), each
compared with the baseline measured before it in the same record.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kb.jsontypes import JsonObject, JsonValue

__all__ = ["RecordedArm", "fix_options", "fix_option_lines", "p_text"]


@dataclass(frozen=True)
class RecordedArm:
    """One probe-arm measurement of an incident record: the evidence's payload as stored
    (`type: arm`), the evidence id and when it was recorded."""

    payload: JsonObject
    evidence_id: str
    recorded_at: JsonValue


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value)


def fix_options(arms: list[RecordedArm]) -> list[tuple[RecordedArm, RecordedArm | None]]:
    """(arm, its baseline) for each arm whose latest verdict is `removes`, in first-seen
    order; `arms` in record order, as `kb.domain.retrotext.record_arms` lists them."""
    baseline: RecordedArm | None = None
    latest: dict[str, tuple[RecordedArm, RecordedArm | None]] = {}
    for arm in arms:
        payload = arm.payload
        if payload.get("decision") == "baseline" or payload.get("arm") == "baseline":
            baseline = arm
            continue
        name = str(payload.get("arm"))
        if payload.get("decision") == "removes":
            latest[name] = (arm, baseline)
        else:
            latest.pop(name, None)  # a later run no longer removes it
    return list(latest.values())


def p_text(arm: JsonObject) -> str:
    """ ", one-sided p = 0.019 vs baseline": the p-value the arm's decision uses (the
    one-sided `p_less`); older records carry only the two-sided `p_value`."""
    one_sided = _number(arm.get("p_less"))
    if one_sided is not None:
        return f", one-sided p = {one_sided:.2g} vs baseline"
    p_value = _number(arm.get("p_value"))
    return f", p = {p_value:.2g} vs baseline" if p_value is not None else ""


def _rate(arm: JsonObject | None) -> str:
    if arm is None:
        return "no baseline on record"
    n, failures = arm.get("n"), arm.get("failures")
    if isinstance(n, int) and isinstance(failures, int) and n > 0:
        return f"{failures}/{n} failed"
    return "failures not recorded"


def _speed(arm: JsonObject, baseline: JsonObject | None) -> str:
    speed = _number(arm.get("speed_tok_s"))
    base = _number(baseline.get("speed_tok_s")) if baseline else None
    if speed is None:
        return "decode speed not measured"
    if base is None or base <= 0:
        return f"decode speed {speed:.0f} tok/s (no baseline speed on record)"
    change = (speed - base) / base
    return f"decode speed {base:.0f} -> {speed:.0f} tok/s ({change:+.0%})"


def fix_option_lines(
    arms: list[RecordedArm],
    escape: Callable[[Any], str],
    cite: Callable[[list[str]], str],
) -> list[str]:
    """One Markdown line per fix option: removal and speed change, citing both arms."""
    lines = []
    for recorded, recorded_baseline in fix_options(arms):
        arm = recorded.payload
        baseline = recorded_baseline.payload if recorded_baseline else None
        variant = f" ({escape(arm['variant'])})" if arm.get("variant") else ""
        keys = [recorded.evidence_id]
        keys += [recorded_baseline.evidence_id] if recorded_baseline else []
        lines.append(
            f"- **{escape(arm.get('arm'))}**{variant}: removes the failure, "
            f"{_rate(arm)} vs {_rate(baseline)}{p_text(arm)}; "
            f"{_speed(arm, baseline)}. {cite(keys)}"
        )
    return lines or ["*No probe arm on record removed the failure.*"]
