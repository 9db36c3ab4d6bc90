"""The crash-only no-warmup and one-thread arms (issue 12): planned only for crash runs and
only where they differ from the baseline; their causes are decided by their k/n."""

from __future__ import annotations

from pathlib import Path

from triage import causes as cause_rules
from triage import probes
from triage.causes import ArmOutcome, observations_from
from triage.engine.arms.crash_variants import NoWarmup, OneThread
from triage.engine.causes.crash_variants import THREADS, WARMUP
from triage.stackfile import parse_stack

REQUEST = {"messages": [{"role": "user", "content": "hi"}]}


def _stack(tmp_path: Path, args: str):  # type: ignore[no-untyped-def]
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    return parse_stack(
        f'[server]\nmodel = "m.gguf"\nargs = [{args}]\n', base=tmp_path, build_missing=False
    )


def test_the_arms_are_crash_only_and_vary_one_thing(tmp_path: Path) -> None:
    stack = _stack(tmp_path, '"-c", "4096", "-t", "8", "-tb=8"')
    warm = NoWarmup().plan(stack, REQUEST)
    one = OneThread().plan(stack, REQUEST)
    assert warm is not None and one is not None
    assert warm.when == one.when == "crash"
    assert list(warm.config.args) == ["-c", "4096", "-t", "8", "-tb=8", "--no-warmup"]
    assert list(one.config.args) == ["-c", "4096", "-t", "1", "-tb", "1"]
    assert warm.decides == ("warmup-decode",) and one.decides == ("cpu-threads",)
    names = [p.name for p in probes.plan_arms(stack, REQUEST)]
    assert "no-warmup" in names and "one-thread" in names


def test_no_arm_that_would_be_the_baseline_again(tmp_path: Path) -> None:
    stack = _stack(tmp_path, '"-t", "1", "-tb", "1", "--no-warmup"')
    assert NoWarmup().plan(stack, REQUEST) is None
    assert OneThread().plan(stack, REQUEST) is None
    url = parse_stack('[server]\nurl = "http://127.0.0.1:9"\n', base=tmp_path)
    assert NoWarmup().plan(url, REQUEST) is None and OneThread().plan(url, REQUEST) is None


def _outcome(name: str, failures: int, n: int, decision: str) -> ArmOutcome:
    return ArmOutcome(
        name=name,
        n=n,
        failures=failures,
        decision=decision,
        p_value=0.001 if decision == "removes" else 1.0,
    )


def test_the_causes_follow_their_arms_k_of_n(tmp_path: Path) -> None:
    stack = _stack(tmp_path, '"-t", "8"')
    obs = observations_from(
        {"startup-crash": {"name": "startup-crash"}},
        stack,
        speculative=False,
        planned=(cause_rules.BASELINE, "no-warmup", "one-thread"),
    )
    arms = {
        cause_rules.BASELINE: _outcome(cause_rules.BASELINE, 8, 8, "baseline"),
        "no-warmup": _outcome("no-warmup", 8, 8, "unchanged"),
        "one-thread": _outcome("one-thread", 0, 8, "removes"),
    }
    warm, threads = WARMUP.decide(arms, obs), THREADS.decide(arms, obs)
    assert warm.status == "rejected" and "8/8" in warm.rationale
    assert threads.status == "confirmed" and "0/8" in threads.rationale
    assert "startup-crash" in threads.supports
    # Not planned (the stack already runs one thread): not testable, never a verdict.
    obs2 = observations_from({}, stack, speculative=False, planned=(cause_rules.BASELINE,))
    assert THREADS.decide(arms, obs2).status == "suspected"
