"""triage.symptoms: every finding kind, its thresholds, and real llama-server replies."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from triage import symptoms
from triage.capture import load_file, parse_pair
from triage.symptoms import (
    CHECKS,
    DIAGNOSTIC_KINDS,
    KINDS,
    RUNAWAY_REPEAT_SHARE,
    USER_FACING_KINDS,
    Finding,
    classify,
    failure_kinds,
    is_failure,
    repeated_ngram_share,
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
REAL = FIXTURES / "real"
PEG = "The model produced output that does not match the expected peg-gemma4 format"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {
                "location": {"type": "string"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1},
            },
            "required": ["location"],
        },
    },
}

# A long, ordinary reasoning trace: restates, recomputes and checks, but does not loop.
NORMAL_REASONING = """The question asks how much the ball costs if a bat and a ball
cost $1.10 in total and the bat costs $1.00 more than the ball. The intuitive answer is
ten cents, but I should check it instead of trusting it. Let the ball cost x dollars.
Then the bat costs x + 1.00 dollars.
Together they cost x + (x + 1.00) = 2x + 1.00, and that has to equal 1.10. Subtracting one
dollar from both sides gives 2x = 0.10, so x = 0.05. The ball therefore costs five cents and
the bat costs one dollar and five cents. Checking the difference: 1.05 minus 0.05 is exactly
1.00, which matches the condition. Checking the total: 1.05 plus 0.05 is 1.10, which also
matches. If the ball cost ten cents, the bat would have to cost 1.10 and the total would be
1.20, so the intuitive answer fails the first condition. Now the user also wants the answer
in Korean and a one-line explanation, so I need to phrase it carefully without repeating the
whole derivation. Something like: the ball is 5 cents because two unknowns with a one dollar
gap split the remaining ten cents evenly. I will also mention the common mistake, because the
user seems to be testing whether the model falls for it. Before writing, consider units: the
prices are in dollars, the answer should say $0.05 rather than 0.05 cents. Also consider
whether there is any trick with taxes or currency; nothing in the prompt suggests that, so I
will not invent complications. Finally, double-check the arithmetic one more time with
integers to avoid floating point slips: in cents, bat plus ball is 110, bat minus ball is 100,
adding gives twice the bat equals 210, so the bat is 105 cents and the ball is 5 cents.
Everything is consistent, and I can write the short answer now with the explanation after it.
For the explanation, a single sentence is enough; the user did not ask for algebra, but an
equation in parentheses helps readers who want to verify it themselves."""

KOREAN_REASONING = """사용자는 항구의 새벽을 묘사하는 정확히 120자 분량의 문단을 원한다.
먼저 핵심 이미지를 고른다: 잿빛 바다, 첫 배가 떠나는 소리, 밧줄을
감는 어부, 카페 셔터가 올라가는 장면. 모든 이미지를 다 넣으면 길이가
넘치므로 두세 개만 남겨야 한다. 첫 초안은 갈매기와 첫 배로 시작하고,
두 번째 문장에서 어부를 보여 주면 리듬이 좋아 보인다. 글자 수를 세어
보니 대략 구십 자 정도라서 조금 부족하다. 종소리를 덧붙이면 백십 자를
조금 넘고, 형용사 하나를 더하면 목표에 가까워진다. 한국어는 띄어쓰기도
글자 수에 포함되는지 확인해야 하는데, 보통은 포함하므로 공백까지 세는
방식으로 맞춘다. 마지막으로 문장이 자연스러운지 소리 내어 읽듯
점검하고, 지나치게 시적인 표현은 덜어 내어 담백하게 마무리한다. 이제
최종 문단을 작성하고 정확한 길이를 한 번 더 확인한 뒤 답을 내놓는다."""


def exchange(
    message: dict[str, Any] | None = None,
    finish: str | None = "stop",
    request: dict[str, Any] | None = None,
    usage: dict[str, Any] | None = None,
    **transport: Any,
) -> dict[str, Any]:
    """An exchange in its dict form (what the engine and the store hand to classify)."""
    response = None
    if message is not None:
        response = {
            "choices": [
                {"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}
            ]
        }
        if usage is not None:
            response["usage"] = usage
    return {
        "request": request if request is not None else {"messages": []},
        "response": response,
        "error": None,
        "status": 200,
        "truncated": False,
        "timed_out": False,
        **transport,
    }


def failed(findings: list[Finding], kind: str) -> list[Finding]:
    return [f for f in findings if f.kind == kind and not f.passed]


def tool_call(arguments: Any, name: str = "get_weather") -> dict[str, Any]:
    return {"id": "c1", "type": "function", "function": {"name": name, "arguments": arguments}}


# ---------------------------------------------------------------------------- registry


def test_registry_covers_every_kind_in_order():
    assert list(CHECKS) == list(KINDS)
    assert USER_FACING_KINDS | DIAGNOSTIC_KINDS == set(KINDS)
    # The model-file lint kinds are decided from the GGUF and the server log, not a reply.
    lint = {"chat-template-missing", "base-model-for-chat", "end-of-turn-mismatch"}
    assert DIAGNOSTIC_KINDS == {"runaway-reasoning", "unstable-prefix", *lint}
    for name in symptoms.__all__:
        assert hasattr(symptoms, name)
    with pytest.raises(ValueError):
        symptoms.check("no-such-kind")


def test_every_check_reports_on_a_healthy_reply():
    findings = classify(exchange({"content": "Hello."}))
    assert [f.kind for f in findings] == list(KINDS)
    assert all(f.passed for f in findings)
    assert not is_failure(exchange({"content": "Hello."}))


def test_finding_to_dict_matches_the_schema_shape():
    data = Finding("empty-content", False, 1.0, "r", "$.x", 3).to_dict()
    assert data == {
        "kind": "empty-content",
        "passed": False,
        "score": 1.0,
        "reason": "r",
        "where": "$.x",
        "offset": 3,
    }


# ---------------------------------------------------------------------------- content


@pytest.mark.parametrize(
    ("message", "expect_fail"),
    [
        ({"content": ""}, True),
        ({"content": None}, True),
        ({"content": "  \n"}, True),
        ({}, True),
        ({"content": "", "reasoning_content": "long thought"}, True),
        ({"content": "", "tool_calls": [tool_call('{"location": "Paris"}')]}, False),
        ({"content": "ok"}, False),
        ({"content": [{"type": "text", "text": "part"}]}, False),
        ({"content": [{"type": "text", "text": ""}]}, True),
    ],
)
def test_empty_content(message, expect_fail):
    findings = failed(classify(exchange(message)), "empty-content")
    assert bool(findings) is expect_fail
    if findings:
        assert findings[0].where == "$.response.choices[0].message.content"


def test_empty_content_does_not_apply_without_a_completion():
    findings = classify(exchange(None, status=500, error={"message": "x"}))
    assert not failed(findings, "empty-content")


def test_length_stop():
    findings = classify(
        exchange({"content": "partial"}, finish="length", request={"max_tokens": 40})
    )
    [finding] = failed(findings, "length-stop")
    assert finding.where == "$.response.choices[0].finish_reason"
    assert "max_tokens 40" in finding.reason
    assert not failed(classify(exchange({"content": "x"}, finish="stop")), "length-stop")
    # an answer cut off by the limit is incomplete: a broken reply
    assert is_failure(exchange({"content": "a long enough answer"}, finish="length"))


# ---------------------------------------------------------------------------- budget


def test_reasoning_exhausted_budget_from_text_share():
    ex = exchange(
        {"content": "", "reasoning_content": "x " * 1400},
        finish="length",
        request={"max_tokens": 800},
        usage={"completion_tokens": 800},
    )
    [finding] = failed(classify(ex), "reasoning-exhausted-budget")
    assert finding.score == 1.0
    assert "~800 of 800 completion tokens" in finding.reason
    assert finding.where == "$.response.choices[0].message.reasoning_content"


def test_reasoning_exhausted_budget_from_reported_reasoning_tokens():
    usage = {"completion_tokens": 800, "completion_tokens_details": {"reasoning_tokens": 780}}
    ex = exchange({"content": "The", "reasoning_content": "think"}, finish="length", usage=usage)
    [finding] = failed(classify(ex), "reasoning-exhausted-budget")
    assert finding.score == pytest.approx(780 / 800)
    assert "780 of 800" in finding.reason


def test_reasoning_budget_cuts_a_started_answer_when_thinking_dominates():
    ex = exchange(
        {
            "content": "Gulls wheel over a grey harbour as the first",
            "reasoning_content": "y" * 2600,
        },
        finish="length",
    )
    [finding] = failed(classify(ex), "reasoning-exhausted-budget")
    assert finding.score > 0.8
    assert is_failure(ex)
    ex = exchange({"content": "x" * 800, "reasoning_content": "y" * 2600}, finish="length")
    assert not failed(classify(ex), "reasoning-exhausted-budget")  # 76%: the answer had room


def test_reasoning_budget_hit_without_length_reason_when_tokens_reach_max():
    ex = exchange(
        {"content": "", "reasoning_content": "thinking " * 50},
        finish=None,
        request={"max_tokens": 100},
        usage={"completion_tokens": 100},
    )
    assert failed(classify(ex), "reasoning-exhausted-budget")


@pytest.mark.parametrize(
    ("message", "finish", "usage"),
    [
        # the model stopped by itself after thinking: empty, but not a budget problem
        ({"content": "", "reasoning_content": "done thinking"}, "stop", None),
        # a real answer was written; the limit cut it later (reasoning 60% of the text)
        ({"content": "x" * 2000, "reasoning_content": "y" * 3000}, "length", None),
        # no reasoning at all
        ({"content": ""}, "length", None),
        # reasoning tokens reported as a minority
        (
            {"content": "", "reasoning_content": "y"},
            "length",
            {"completion_tokens": 800, "completion_tokens_details": {"reasoning_tokens": 100}},
        ),
    ],
)
def test_reasoning_budget_not_exhausted(message, finish, usage):
    assert not failed(
        classify(exchange(message, finish=finish, usage=usage)), "reasoning-exhausted-budget"
    )


def test_budget_uses_timings_when_usage_is_missing():
    response = json.loads((REAL / "budget-greedy.response.json").read_text())
    del response["usage"]
    ex = parse_pair(None, json.dumps(response))
    [finding] = failed(classify(ex), "reasoning-exhausted-budget")
    assert "of 800 completion tokens" in finding.reason


# ---------------------------------------------------------------------------- runaway


def test_repeated_ngram_share_measures_loops():
    assert repeated_ngram_share("") == 0.0
    assert repeated_ngram_share("short text repeated " * 3) == 0.0  # too short to judge
    loop = "Recount the letters and check the rhythm once more before writing. " * 20
    assert repeated_ngram_share(loop) > 0.9
    late = NORMAL_REASONING + " " + "Wait, I should recount the characters again. " * 40
    assert repeated_ngram_share(late) >= RUNAWAY_REPEAT_SHARE


@pytest.mark.parametrize("text", [NORMAL_REASONING, KOREAN_REASONING])
def test_normal_reasoning_stays_below_the_threshold(text):
    assert repeated_ngram_share(text) < RUNAWAY_REPEAT_SHARE / 2


def test_tables_and_bullets_do_not_count_as_loops():
    rows = "\n".join(
        f"| {name} | {i * 7} | {i * 3 % 5} |"
        for i, name in enumerate(
            "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi "
            "rho sigma tau upsilon phi chi psi omega".split()
        )
    )
    border = "+--------+--------+\n"
    text = NORMAL_REASONING + "\n" + border + rows.replace("\n", "\n" + border)
    assert repeated_ngram_share(text) < RUNAWAY_REPEAT_SHARE


def test_unspaced_text_uses_character_ngrams():
    chinese = "我们需要计算这个问题的答案首先考虑第一个条件然后检查结果"
    assert repeated_ngram_share(chinese * 12) > 0.8
    distinct = "".join(chr(0x4E00 + (i * 37) % 20000) for i in range(400))
    assert repeated_ngram_share(distinct) < 0.1


def test_runaway_reasoning_finding():
    loop = "Count it again: one hundred and forty-one, too long. Drop a word. " * 30
    [finding] = failed(
        classify(exchange({"content": "ok", "reasoning_content": loop})), "runaway-reasoning"
    )
    assert finding.score >= RUNAWAY_REPEAT_SHARE
    assert finding.where == "$.response.choices[0].message.reasoning_content"
    normal = classify(exchange({"content": "ok", "reasoning_content": NORMAL_REASONING}))
    assert not failed(normal, "runaway-reasoning")
    # diagnostic: a thought that looped but ended in an answer is not a broken reply
    assert not is_failure(exchange({"content": "ok", "reasoning_content": loop}))


# ---------------------------------------------------------------------------- tool calls


@pytest.mark.parametrize(
    ("arguments", "fragment", "offset"),
    [
        ('{"location": "Paris"', "not valid JSON", 20),
        ("", "empty string", 0),
        ("[1, 2]", "not an object", 0),
        (None, "missing", None),
        (7, "not an object string", None),
        ("{'location': 'Paris'}", "not valid JSON", 1),
    ],
)
def test_tool_args_invalid_json(arguments, fragment, offset):
    ex = exchange({"content": "", "tool_calls": [tool_call(arguments)]}, finish="tool_calls")
    [finding] = failed(classify(ex), "tool-args-invalid-json")
    assert fragment in finding.reason
    assert finding.where == "$.response.choices[0].message.tool_calls[0].function.arguments"
    assert finding.offset == offset
    assert is_failure(ex)


def test_tool_args_valid_json_and_object_arguments():
    for arguments in ('{"location": "Paris"}', {"location": "Paris"}):
        ex = exchange(
            {"content": "", "tool_calls": [tool_call(arguments)]}, request={"tools": [WEATHER]}
        )
        assert not failed(classify(ex), "tool-args-invalid-json")
        assert not failed(classify(ex), "tool-args-schema-violation")


@pytest.mark.parametrize(
    ("arguments", "name", "where_suffix", "fragment"),
    [
        ('{"unit": "celsius"}', "get_weather", ".arguments", "'location' is a required property"),
        (
            '{"location": "Paris", "unit": "kelvin"}',
            "get_weather",
            ".arguments.unit",
            "is not one of",
        ),
        ('{"location": "Paris", "days": 0}', "get_weather", ".arguments.days", "minimum"),
        ('{"location": 3}', "get_weather", ".arguments.location", "is not of type 'string'"),
        ('{"location": "Paris"}', "get_wether", ".name", "not among the request's tools"),
    ],
)
def test_tool_args_schema_violation(arguments, name, where_suffix, fragment):
    ex = exchange(
        {"content": "", "tool_calls": [tool_call(arguments, name)]},
        finish="tool_calls",
        request={"tools": [WEATHER]},
    )
    [finding] = failed(classify(ex), "tool-args-schema-violation")
    assert finding.where == "$.response.choices[0].message.tool_calls[0].function" + where_suffix
    assert fragment in finding.reason or "less than the minimum" in finding.reason


def test_schema_check_needs_declared_tools_and_a_usable_schema():
    call = {"content": "", "tool_calls": [tool_call('{"x": 1}')]}
    assert not failed(classify(exchange(call, request={})), "tool-args-schema-violation")
    broken = {"type": "function", "function": {"name": "get_weather", "parameters": {"type": 5}}}
    assert not failed(
        classify(exchange(call, request={"tools": [broken]})), "tool-args-schema-violation"
    )
    legacy = {
        "functions": [{"name": "get_weather", "parameters": WEATHER["function"]["parameters"]}]
    }
    assert failed(classify(exchange(call, request=legacy)), "tool-args-schema-violation")


# ---------------------------------------------------------------------------- markup


@pytest.mark.parametrize(
    ("channel", "text", "token"),
    [
        (
            "content",
            '<|tool_call>call:get_weather{location:<|"|>Paris<|"|>}<tool_call|>',
            "<|tool_call>",
        ),
        ("content", "Sure. call:get_weather{location:Paris}", "call:get_weather{"),
        (
            "reasoning_content",
            "I will call it.<|tool_call>call:get_weather{location:Paris}",
            "<|tool_call>",
        ),
        (
            "content",
            '<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
            "<tool_call>",
        ),
        ("content", '[TOOL_CALLS][{"name": "get_weather", "arguments": {}}]', "[TOOL_CALLS]"),
        ("content", "<function=get_weather>\n<parameter=location>Paris", "<function=get_weather>"),
        ("content", '<|python_tag|>{"name": "get_weather"}', "<|python_tag|>"),
    ],
)
def test_tool_markup_leaked(channel, text, token):
    ex = exchange({"content": "", channel: text}, request={"tools": [WEATHER]})
    [finding] = failed(classify(ex), "tool-markup-leaked")
    assert token in finding.reason
    assert finding.where == f"$.response.choices[0].message.{channel}"
    assert finding.offset == text.index(token)
    assert is_failure(ex)


def test_bare_tool_json_counts_only_for_declared_tools():
    bare = 'Here: {"name": "get_weather", "arguments": {"location": "Paris"}}'
    with_tools = classify(exchange({"content": bare}, request={"tools": [WEATHER]}))
    [finding] = failed(with_tools, "tool-markup-leaked")
    assert finding.score == 1.0 and finding.offset == bare.index("{")
    # a JSON answer that merely has these keys, in a request without that tool
    assert not failed(
        classify(exchange({"content": bare}, request={"messages": []})), "tool-markup-leaked"
    )
    other = {"type": "function", "function": {"name": "search"}}
    assert not failed(
        classify(exchange({"content": bare}, request={"tools": [other]})), "tool-markup-leaked"
    )
    # no request in the capture: likely a leak, said with a lower score
    [unknown] = failed(classify(exchange({"content": bare}, request={})), "tool-markup-leaked")
    assert unknown.score < 1.0


def test_prose_about_tools_is_not_markup():
    text = "I would call the weather tool with the location set to Paris: recall: a{b} is fine."
    assert not failed(
        classify(exchange({"content": text}, request={"tools": [WEATHER]})), "tool-markup-leaked"
    )


# ---------------------------------------------------------------------------- transport


@pytest.mark.parametrize(
    ("message", "fmt"),
    [
        (PEG, "peg-gemma4"),
        (
            "got exception: The model produced output that does not match "
            "the expected peg-native format",
            "peg-native",
        ),
        ("Failed to parse tool call arguments as JSON: [json.exception.parse_error.101]", None),
        ("Failed to parse input at pos 57: <|tool_call>call:x{", None),
        ("Invalid diff: tool call mismatch!", None),
    ],
)
def test_parse_failure(message, fmt):
    ex = exchange(None, status=500, error={"message": message, "type": "server_error", "code": 500})
    [finding] = failed(classify(ex), "parse-failure")
    assert finding.where == "$.error.message"
    if fmt:
        assert f"the {fmt} parser" in finding.reason
    assert failed(classify(ex), "http-error")
    assert is_failure(ex)


def test_parse_failure_in_a_plain_text_body():
    ex = exchange(None, status=500, response_text=f"got exception: {PEG}")
    [finding] = failed(classify(ex), "parse-failure")
    assert finding.where == "$.response_text"


def test_other_server_errors_are_not_parse_failures():
    ex = exchange(
        None, status=400, error={"message": "the request exceeds the available context size"}
    )
    assert not failed(classify(ex), "parse-failure")
    assert failed(classify(ex), "http-error")


def test_truncated_stream():
    ex = exchange({"content": "partial"}, finish=None, truncated=True, stream=True)
    [finding] = failed(classify(ex), "truncated-stream")
    assert finding.where == "$.truncated"
    assert is_failure(ex)


@pytest.mark.parametrize(
    ("transport", "where"),
    [
        ({"status": 503, "error": {"message": "Loading model"}}, "$.status"),
        ({"status": None, "error": {"message": "boom", "in_stream": True}}, "$.error"),
        ({"status": 200, "response": None}, "$.response"),
    ],
)
def test_http_error(transport, where):
    ex = {**exchange(None), **transport}
    [finding] = failed(classify(ex), "http-error")
    assert finding.where == where


def test_error_object_inside_the_response_body():
    ex = exchange(None, status=None)
    ex["response"] = {"error": {"code": 500, "message": PEG}}
    kinds = failure_kinds(ex)
    assert {"http-error", "parse-failure"} <= kinds


@pytest.mark.parametrize(
    ("transport", "where"),
    [({"timed_out": True, "status": None}, "$.timed_out"), ({"status": 504}, "$.status")],
)
def test_timeout(transport, where):
    ex = {**exchange(None), **transport}
    [finding] = failed(classify(ex), "timeout")
    assert finding.where == where
    assert is_failure(ex)
    if transport.get("timed_out"):
        assert not failed(classify(ex), "http-error")


# ---------------------------------------------------------------------------- real replies

REAL_EXPECTATIONS = [
    # (request, response, failed kinds, is_failure)
    (
        "budget-greedy",
        "budget-greedy.response.json",
        {"empty-content", "length-stop", "reasoning-exhausted-budget", "runaway-reasoning"},
        True,
    ),
    (
        "budget-greedy-120",
        "budget-greedy-120.response.sse",
        {"empty-content", "length-stop", "reasoning-exhausted-budget"},
        True,
    ),
    ("budget-thinking-off", "budget-thinking-off.response.json", set(), False),
    ("budget-thinking-off-40", "budget-thinking-off-40.response.sse", {"length-stop"}, True),
    (
        "toolcall-leak-seed2",
        "toolcall-leak-seed2.response.json",
        {"empty-content", "tool-markup-leaked"},
        True,
    ),
    (
        "toolcall-leak-seed2",
        "toolcall-leak-seed2.response.sse",
        {"empty-content", "tool-markup-leaked"},
        True,
    ),
    ("toolcall-ok-seed1", "toolcall-ok-seed1.response.json", set(), False),
    ("toolcall-ok-seed1", "toolcall-ok-seed1.response.sse", set(), False),
    ("bad-request", "bad-request.response.json", {"http-error"}, True),
]


@pytest.mark.parametrize(("stem", "response", "kinds", "failure"), REAL_EXPECTATIONS)
def test_real_llama_server_replies(stem, response, kinds, failure):
    request = REAL / f"{stem}.request.json"
    ex = (
        load_file(REAL / response, request=request)[0]
        if response.endswith(".sse")
        else (load_file(request, response=REAL / response)[0])
    )
    assert failure_kinds(ex) == kinds
    assert is_failure(ex) is failure
    assert failure_kinds(ex.to_dict()) == kinds


HAND_WRITTEN = [
    ("tool-args-invalid-json.json", None, {"tool-args-invalid-json"}),
    ("tool-args-schema-violation.json", None, {"tool-args-schema-violation"}),
    ("markup-hermes-content.json", None, {"tool-markup-leaked"}),
    ("markup-bare-json.json", None, {"tool-markup-leaked"}),
    ("stream-peg-error.sse", None, {"parse-failure", "http-error"}),
    ("stream-bare-error.sse", None, {"parse-failure", "http-error"}),
    ("stream-truncated.sse", None, {"empty-content", "truncated-stream"}),
    ("stream-tool-deltas.sse", "stream-tool-deltas.request.json", set()),
    ("peg-gemma4-500.curl", "peg-gemma4-500.response.txt", {"parse-failure", "http-error"}),
    ("timeout.curl", None, {"timeout"}),
]


@pytest.mark.parametrize(("name", "companion", "kinds"), HAND_WRITTEN)
def test_hand_written_captures(name, companion, kinds):
    path = FIXTURES / name
    if companion is None:
        ex = load_file(path)[0]
    elif name.endswith(".sse"):
        ex = load_file(path, request=FIXTURES / companion)[0]
    else:
        ex = load_file(path, response=FIXTURES / companion)[0]
    assert failure_kinds(ex) == kinds


def test_jsonl_log_kinds_per_line():
    kinds = [failure_kinds(ex) for ex in load_file(FIXTURES / "exchanges.jsonl")]
    assert kinds == [
        set(),
        {"empty-content", "length-stop", "reasoning-exhausted-budget", "runaway-reasoning"},
        {"parse-failure", "http-error"},
        {"timeout"},
        set(),
        {"tool-args-schema-violation"},
    ]


def test_har_kinds_per_entry():
    kinds = [failure_kinds(ex) for ex in load_file(FIXTURES / "agent-session.har")]
    assert kinds == [
        {"empty-content", "length-stop", "reasoning-exhausted-budget", "runaway-reasoning"},
        {"empty-content", "tool-markup-leaked"},
        {"timeout"},
    ]


# ---------------------------------------------------------------------------- robustness

ANY_JSON = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), st.text(max_size=30)
    ),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(
            st.sampled_from(
                [
                    "request",
                    "response",
                    "choices",
                    "message",
                    "content",
                    "reasoning_content",
                    "tool_calls",
                    "function",
                    "arguments",
                    "name",
                    "finish_reason",
                    "usage",
                    "completion_tokens",
                    "tools",
                    "parameters",
                    "error",
                    "status",
                    "message",
                    "truncated",
                    "timed_out",
                    "max_tokens",
                    "text",
                    "delta",
                    "x",
                ]
            ),
            children,
            max_size=5,
        )
    ),
    max_leaves=25,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ANY_JSON)
def test_classify_never_raises_on_any_dict(value):
    findings = classify(value)
    assert {f.kind for f in findings} == set(KINDS)
    for finding in findings:
        assert 0.0 <= finding.score <= 1.0
        assert isinstance(finding.reason, str) and finding.reason
    is_failure(value)
