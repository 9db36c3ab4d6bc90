"""The example third-party plugin (tests/plugins/triage_example) piece by piece, without a
server: its arm only touches stacks that opt in, its check only flags all-thought replies,
its format refuses bad logs naming the line, and its cause needs a reproduced baseline and
a decided arm. The plugin is loaded through an entry point naming its module (what its
pyproject declares), for these tests only; the end-to-end run, with the distribution really
installed, is tests/integration/test_plugin_e2e.py."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

import triage.catalogue
from triage.capture import CaptureError, detect_format, parse
from triage.catalogue import ENTRY_POINT_GROUP, Catalogue
from triage.causes import ArmOutcome, Observations
from triage.probes import plan_arms
from triage.stackfile import parse_stack
from triage.stats import compare, look_schedule
from triage.symptoms import classify, is_failure

PLUGIN_SOURCE = Path(__file__).resolve().parents[1] / "plugins" / "triage_example"
REQUEST = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 800}


@pytest.fixture(autouse=True)
def cat(monkeypatch: pytest.MonkeyPatch) -> Catalogue:
    """The installed plugins plus the example's entry point, as the process catalogue."""
    monkeypatch.syspath_prepend(str(PLUGIN_SOURCE))
    example = metadata.EntryPoint(name="example", value="triage_example", group=ENTRY_POINT_GROUP)
    loaded = Catalogue.load([*metadata.entry_points(group=ENTRY_POINT_GROUP), example])
    monkeypatch.setattr(triage.catalogue, "catalogue", lambda: loaded)
    return loaded


def _stack(tmp_path: Path, *args: str) -> Any:
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    return parse_stack(
        f'[server]\nmodel = "w.gguf"\nargs = {json.dumps(list(args))}\n', base=tmp_path
    )


def test_the_entry_point_alone_registers_all_four(cat: Catalogue) -> None:
    assert {
        cat.formats.origin("vgw"),
        cat.checks.origin("all-thought-reply"),
        cat.causes.origin("unbounded-reasoning-budget"),
        cat.arms.origin("server-reasoning-budget"),
    } == {"example"}
    assert cat.causes.numbers()["unbounded-reasoning-budget"] == 32
    assert cat.checks.numbers()["all-thought-reply"] == 32


@pytest.mark.parametrize(
    ("args", "planned"),
    [
        ((), None),  # no --reasoning-budget of its own: not opted in, no extra launch
        (("--reasoning-budget", "-1"), "200"),
        (("--reasoning-budget=900",), "200"),  # >= max_tokens: does not bound the thought
        (("--reasoning-budget", "100"), None),  # already bounded below max_tokens
        (("--reasoning-budget", "lots"), None),
    ],
)
def test_the_arm_applies_only_to_stacks_that_opt_in(
    tmp_path: Path, args: tuple[str, ...], planned: str | None
) -> None:
    stack = _stack(tmp_path, "-c", "512", *args)
    arms = {a.name: a for a in plan_arms(stack, REQUEST)}
    if planned is None:
        assert "server-reasoning-budget" not in arms
        return
    arm = arms["server-reasoning-budget"]
    assert arm.level == "server" and arm.decides == ("unbounded-reasoning-budget",)
    assert arm.config is not None
    assert list(arm.config.args) == ["-c", "512", "--reasoning-budget", planned]


def test_the_arm_needs_max_tokens(tmp_path: Path) -> None:
    stack = _stack(tmp_path, "--reasoning-budget", "-1")
    request = {"messages": REQUEST["messages"]}
    assert "server-reasoning-budget" not in [a.name for a in plan_arms(stack, request)]


def _reply(content: str, reasoning: str, **extra: Any) -> dict[str, Any]:
    message = {"role": "assistant", "content": content, "reasoning_content": reasoning, **extra}
    return {
        "request": REQUEST,
        "status": 200,
        "response": {"choices": [{"index": 0, "message": message, "finish_reason": "length"}]},
    }


def _kinds(exchange: dict[str, Any]) -> set[str]:
    return {f.kind for f in classify(exchange) if not f.passed}


def test_the_check_flags_only_a_long_thought_without_an_answer() -> None:
    assert "all-thought-reply" in _kinds(_reply("", "t" * 1000))
    assert "all-thought-reply" not in _kinds(_reply("", "t" * 999))  # short: empty only
    assert "all-thought-reply" not in _kinds(_reply("The answer.", "t" * 5000))
    call = [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]
    assert "all-thought-reply" not in _kinds(_reply("", "t" * 5000, tool_calls=call))
    # A subset of empty-content: it never turns a passing reply into a failing one.
    assert is_failure(_reply("", "t" * 1000)) and is_failure(_reply("", "t" * 999))


def _log(*lines: str) -> str:
    return "# gateway export\n" + "\n".join(lines) + "\n"


REQ = f"VGW/1 t r1 REQ POST /v1/chat/completions {json.dumps(REQUEST)}"
RES = "VGW/1 t r1 RES 200 12ms " + json.dumps(_reply("", "t" * 1200)["response"])


def test_the_format_is_sniffed_and_parsed_with_headers_redacted() -> None:
    text = _log(REQ, "VGW/1 t r1 HDR Authorization: Bearer sk-unit-canary-0123456789abcdef", RES)
    assert detect_format(text) == "vgw"
    [exchange] = parse(text, file="gw.log")
    assert exchange.source_format == "vgw" and exchange.status == 200
    assert exchange.request["max_tokens"] == 800
    assert "sk-unit-canary" not in json.dumps(exchange.to_dict())
    assert "all-thought-reply" in _kinds(exchange.to_dict())


@pytest.mark.parametrize(
    ("lines", "line", "message"),
    [
        ((RES,), 2, "no open REQ"),
        ((REQ,), 2, "no RES line"),
        ((REQ, REQ, RES), 3, "opened twice"),
        ((REQ, "VGW/1 t r1 BODY x"), 3, "unknown event"),
        (("VGW/1 t r1 REQ POST /v1 {not json",), 2, "not valid JSON"),
        ((REQ, "VGW/1 t r1 RES 200 soon {}"), 3, "RES <status> <elapsed>ms"),
        ((REQ, "VGW/1 t r1 HDR no-colon"), 3, "HDR <name>: <value>"),
    ],
)
def test_a_bad_log_is_refused_naming_the_line(
    lines: tuple[str, ...], line: int, message: str
) -> None:
    with pytest.raises(CaptureError) as err:
        parse(_log(*lines), file="gw.log", format="vgw")
    assert f"gw.log:{line}" in str(err.value) or f"line {line}" in str(err.value)
    assert message in str(err.value)


def _arms(base_k: int, base_n: int, arm_k: int, arm_n: int) -> dict[str, ArmOutcome]:
    cmp = compare(base_k, base_n, arm_k, arm_n, looks=len(look_schedule()))
    base = ArmOutcome(
        "baseline",
        base_n,
        base_k,
        "baseline",
        kind_counts={"all-thought-reply": base_k, "empty-content": base_k},
    )
    arm = ArmOutcome("server-reasoning-budget", arm_n, arm_k, cmp.decision, p_value=cmp.p_less)
    return {"baseline": base, "server-reasoning-budget": arm}


PLANNED = Observations(planned=("baseline", "server-reasoning-budget"))


def test_the_cause_is_confirmed_by_its_arm_but_never_from_one_sample(cat: Catalogue) -> None:
    cause = cat.causes["unbounded-reasoning-budget"]
    assert cause.decide(_arms(1, 1, 0, 1), PLANNED).status == "suspected"
    confirmed = cause.decide(_arms(8, 8, 0, 8), PLANNED)
    assert confirmed.status == "confirmed" and "server-reasoning-budget" in confirmed.supports
    assert cause.decide(_arms(8, 8, 8, 8), PLANNED).status == "rejected"


def test_the_cause_is_untested_without_its_arm_or_a_reproduced_failure(cat: Catalogue) -> None:
    cause = cat.causes["unbounded-reasoning-budget"]
    not_planned = cause.decide(_arms(8, 8, 0, 8), Observations(planned=("baseline",)))
    assert (not_planned.status, not_planned.basis) == ("suspected", "untested")
    assert "--reasoning-budget" in not_planned.rationale
    quiet = cause.decide(_arms(0, 8, 0, 8), PLANNED)
    assert (quiet.status, quiet.basis) == ("suspected", "untested")


def test_the_cause_is_rejected_when_no_failing_reply_is_all_thought(cat: Catalogue) -> None:
    cause = cat.causes["unbounded-reasoning-budget"]
    arms = _arms(8, 8, 0, 8)
    arms["baseline"].kind_counts = {"empty-content": 8}
    verdict = cause.decide(arms, PLANNED)
    assert verdict.status == "rejected" and "all thought" in verdict.rationale
