"""server-flags without a real server: the binary's --help parsed into its flags, unknown
flags named (with the closest spelling) before anything launches, the refusal lines found
in logs and error bodies, the server-flag-error finding, the jinja-on arm and the rule."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from triage.capture import exchange_from_http
from triage.causes import ArmOutcome, Observations
from triage.engine.arms.jinja import JinjaOn, jinja_off
from triage.engine.causes.server_flags import CAUSE
from triage.engine.runner import startup_refusal
from triage.engine.servers import EngineError, check_flags
from triage.llama.flags import binary_flags, flag_error_line, parse_help, unknown_flags
from triage.stackfile import parse_stack
from triage.symptoms import classify

HELP = """----- common params -----

-h,    --help, --usage                  print usage and exit
-t,    --threads N                      number of CPU threads to use during generation (default: -1)
                                        (env: LLAMA_ARG_THREADS)
--cpu-strict <0|1>                      use strict CPU placement (default: 0)
-Cr,   --cpu-range lo-hi                range of CPUs for affinity. Complements --cpu-mask
-c,    --ctx-size N                     size of the prompt context (default: 0)
-n,    --predict, --n-predict N         number of tokens to predict (default: -1)
--jinja, --no-jinja                     whether to use jinja template engine for chat
-np,   --parallel N                     number of server slots (default: -1)
"""
EXTRA = "".join(f"--flag-{i}                                a flag\n" for i in range(20))
REQUEST = {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}


def test_the_help_flag_column_is_parsed_and_descriptions_are_not() -> None:
    flags = parse_help(HELP)
    assert {"-t", "--threads", "-c", "--ctx-size", "-n", "--predict", "--n-predict"} <= flags
    assert {"--jinja", "--no-jinja", "--cpu-strict", "-Cr", "--cpu-range", "-np"} <= flags
    assert "--cpu-mask" not in flags  # named in a description only
    assert "-hi" not in flags and "-1" not in flags


def test_unknown_flags_are_named_with_the_closest_known_spelling() -> None:
    flags = parse_help(HELP)
    found = unknown_flags(["-c", "4096", "--ctx-sise=8", "--frobnicate", "-t", "-1"], flags)
    assert [u.text() for u in found] == ["--ctx-sise (did you mean --ctx-size?)", "--frobnicate"]
    assert unknown_flags(["--anything"], frozenset()) == []  # usage unreadable: no check


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "llama-server"
    path.write_text(f"#!/bin/sh\ncat <<'EOF'\n{text}EOF\n")
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_an_unknown_flag_is_refused_before_launching_naming_the_field(tmp_path: Path) -> None:
    binary = _script(tmp_path, HELP + EXTRA)
    assert "--flag-3" in binary_flags(binary)
    check_flags(binary, ["-c", "4096", "--no-jinja"], "$.server")  # all known: no error
    with pytest.raises(EngineError) as caught:
        check_flags(binary, ["-c", "4096", "--paralel", "2"], "$.server")
    message = str(caught.value)
    assert message.startswith("$.server.args:")
    assert "--paralel (did you mean --parallel?)" in message


def test_a_binary_whose_help_lists_almost_nothing_is_not_checked(tmp_path: Path) -> None:
    binary = _script(tmp_path, "usage: wrapper [args]\n-x    a flag\n")
    assert binary_flags(binary) == frozenset()
    check_flags(binary, ["--anything-at-all"], "$.server")


@pytest.mark.parametrize(
    ("text", "line"),
    [
        ("...\nerror: invalid argument: --foo-bar\n", "error: invalid argument: --foo-bar"),
        ('error while handling argument "-c": stoi\n', 'error while handling argument "-c": stoi'),
        (
            "init: chat template parsing error: this custom template is not supported, try "
            "using --jinja",
            "this custom template is not supported, try using --jinja",
        ),
        ('{"error":{"message":"tools param requires --jinja flag"}}', "tools param requires"),
    ],
)
def test_refusal_lines_are_found(text: str, line: str) -> None:
    found = flag_error_line(text)
    assert found is not None and found.startswith(line)


def test_a_crash_or_an_ordinary_log_is_no_refusal() -> None:
    assert flag_error_line("Segmentation fault\n#0 ggml_backend_amx_mul_mat") is None
    assert flag_error_line("") is None


def test_a_tools_refusal_is_a_server_flag_error_finding() -> None:
    body = {"error": {"code": 500, "message": "tools param requires --jinja flag"}}
    failed = {f.kind: f.reason for f in classify(exchange_from_http(REQUEST, body, status=500))}
    assert "tools param requires --jinja flag" in failed["server-flag-error"]
    ok = {"choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": "stop"}]}
    passed = [f for f in classify(exchange_from_http(REQUEST, ok, status=200))]
    assert all(f.passed for f in passed if f.kind == "server-flag-error")


class _Report:
    log_tail = ["load_model: ...", "error: invalid argument: --frobnicate"]
    errors: list[str] = []


def test_a_startup_exit_names_the_refused_flag() -> None:
    text = startup_refusal(RuntimeError("exited with code 1 during startup"), _Report())
    assert "server-flags" in text and "--frobnicate" in text
    assert startup_refusal(RuntimeError("exited with code -11"), None) == ""


def _stack(args: list[str], url: bool = False) -> Any:
    model = "" if url else 'model = "m.gguf"\n'
    where = 'url = "http://127.0.0.1:8080"\n' if url else ""
    return parse_stack(
        f"[server]\n{model}{where}args = {args!r}\n".replace("'", '"'), base=Path(".")
    )


def test_jinja_on_is_planned_only_for_a_relaunchable_server_with_jinja_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "m.gguf").write_bytes(b"GGUF")
    planned = JinjaOn().plan(_stack(["-c", "4096", "--no-jinja"]), REQUEST)
    assert planned is not None and planned.config is not None
    assert planned.config.args == ("-c", "4096", "--jinja") and planned.decides == ("server-flags",)
    assert JinjaOn().plan(_stack(["--no-jinja", "--jinja"]), REQUEST) is None  # last one wins
    assert JinjaOn().plan(_stack(["--no-jinja"], url=True), REQUEST) is None
    assert jinja_off(["--jinja", "--no-jinja"]) and not jinja_off([])


def _arm(name: str, failures: int, n: int, decision: str, **extra: Any) -> ArmOutcome:
    return ArmOutcome(name, n, failures, decision, p_value=0.001, **extra)


REFUSED = {"server-flag-error": 8, "http-error": 8}


def test_jinja_on_removing_the_refusal_confirms_it() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "undecided", kind_counts=REFUSED),
        "jinja-on": _arm("jinja-on", 0, 8, "removes"),
    }
    verdict = CAUSE.decide(arms, Observations(planned=("baseline", "jinja-on")))
    assert verdict.status == "confirmed" and "0/8" in verdict.rationale
    assert "100% of the failing baseline replies are the server refusing" in verdict.rationale


def test_jinja_on_failing_the_same_way_rejects_it() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "undecided", kind_counts={"length-stop": 8}),
        "jinja-on": _arm("jinja-on", 8, 8, "unchanged", kind_counts={"length-stop": 8}),
    }
    verdict = CAUSE.decide(arms, Observations(planned=("baseline", "jinja-on")))
    assert verdict.status == "rejected"


def test_without_the_arm_refusals_leave_it_untested_and_known_args_reject_it() -> None:
    refused = {"baseline": _arm("baseline", 8, 8, "undecided", kind_counts=REFUSED)}
    verdict = CAUSE.decide(refused, Observations(planned=("baseline",)))
    assert (verdict.status, verdict.basis) == ("suspected", "untested")
    other = {"baseline": _arm("baseline", 8, 8, "undecided", kind_counts={"length-stop": 8})}
    known = Observations(planned=("baseline",), facts={"server-config": {"args_known": True}})
    assert CAUSE.decide(other, known).status == "rejected"
    unknown = Observations(planned=("baseline",), facts={"server-config": {"args_known": False}})
    assert CAUSE.decide(other, unknown).basis == "untested"
