"""gateway-timeout without servers: the `[gateway]` stack section and its errors, the
gateway-error finding (nginx, LiteLLM, plain-text pages; never llama-server's own errors),
the reproduction gate across a gateway, the fixed-deadline reading and the cause rule."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kb.domain.diagnosis import Finding
from kb.domain.records import Reply
from triage.capture import exchange_from_http
from triage.causes import ArmOutcome, Observations
from triage.engine.arms.gateway import GatewayDirect, GatewayStreamed
from triage.engine.causes.gateway import CAUSE, fixed_deadline
from triage.engine.reproduction import Signature
from triage.engine.servers import Server, gateway_server
from triage.probes import plan_arms
from triage.stackfile import StackError, parse_stack
from triage.symptoms import classify

REQUEST = {"model": "drill", "messages": [{"role": "user", "content": "list it all"}]}
SERVER = '[server]\nurl = "http://127.0.0.1:8080"\n'
GATEWAY = SERVER + '[gateway]\nurl = "http://127.0.0.1:4000"\nname = "litellm"\n'
NGINX_504 = (
    "<html>\r\n<head><title>504 Gateway Time-out</title></head>\r\n<body>\r\n<center><h1>504 "
    "Gateway Time-out</h1></center>\r\n<hr><center>nginx/1.22.1</center>\r\n</body>\r\n</html>"
)
LITELLM_408 = {
    "error": {
        "message": "litellm.Timeout: APITimeoutError - Request timed out. - timeout value=2.0",
        "type": "invalid_request_error",
        "param": None,
        "code": "408",
    }
}


def _stack(text: str) -> Any:
    return parse_stack(text, base=Path("."))


def _failed(body: Any, status: int, elapsed_ms: float | None = None) -> dict[str, str]:
    exchange = exchange_from_http(REQUEST, body, status=status, elapsed_ms=elapsed_ms)
    return {f.kind: f.reason for f in classify(exchange) if not f.passed}


# -- the stack section ---------------------------------------------------------------------


def test_a_gateway_section_is_read_with_its_url_and_name() -> None:
    stack = _stack(GATEWAY)
    assert stack.gateway is not None
    assert (stack.gateway.url, stack.gateway.name) == ("http://127.0.0.1:4000", "litellm")
    assert _stack(SERVER).gateway is None


@pytest.mark.parametrize(
    ("text", "names"),
    [
        (SERVER + "[gateway]\nname = 'x'\n", "$.gateway: 'url' is a required property"),
        (SERVER + '[gateway]\nurl = "ftp://x"\n', "$.gateway.url"),
        (SERVER + '[gateway]\nurl = "http://127.0.0.1:8080/"\n', "the server's own address"),
        (
            '[server]\nmodel = "m.gguf"\nurl = "http://127.0.0.1:8080"\n'
            '[gateway]\nurl = "http://127.0.0.1:4000"\n',
            "no $.server.model",
        ),
        (
            '[server]\nmodel = "m.gguf"\n[gateway]\nurl = "http://127.0.0.1:4000"\n',
            "give that server as $.server.url",
        ),
        (
            SERVER + '[gateway]\nurl = "http://127.0.0.1:4000"\napi_key_env = "NC_UNSET_KEY_X"\n',
            "$.gateway.api_key_env: the environment variable NC_UNSET_KEY_X is not set",
        ),
        (SERVER + '[gateway]\nurl = "http://127.0.0.1:4000"\ncolour = 1\n', "$.gateway"),
    ],
)
def test_a_bad_gateway_section_is_refused_naming_the_field(text: str, names: str) -> None:
    with pytest.raises(StackError) as caught:
        _stack(text)
    assert names in str(caught.value)


def test_the_gateway_key_is_read_from_the_environment_and_sent_only_to_the_gateway(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("NC_GATEWAY_KEY", "sk-secret-value-1234")
    stack = _stack(GATEWAY + 'api_key_env = "NC_GATEWAY_KEY"\n')
    assert "sk-secret" not in repr(stack.gateway)
    base = Server("k", stack.server, "http://127.0.0.1:8080", 4, 0.0)
    client = gateway_server(stack, base)
    assert (client.base_url, client.api_key, client.slots) == (
        "http://127.0.0.1:4000",
        "sk-secret-value-1234",
        4,
    )
    assert gateway_server(_stack(SERVER), base) is base  # no gateway: the server itself


# -- the finding ---------------------------------------------------------------------------


def test_an_nginx_504_page_is_a_gateway_error_not_a_server_hang() -> None:
    failed = _failed(NGINX_504, 504, elapsed_ms=2003)
    assert "nginx" in failed["gateway-error"] and "after 2.0 s" in failed["gateway-error"]
    assert not set(failed) & {"server-crash", "server-hang"}
    assert "timeout" in failed  # it is still a timeout, as the client saw it


def test_a_litellm_timeout_is_a_gateway_error() -> None:
    failed = _failed(LITELLM_408, 408, elapsed_ms=60_400)
    assert "LiteLLM" in failed["gateway-error"]
    assert "a common 60 s gateway/client deadline" in failed["gateway-error"]


def test_plain_text_and_unknown_html_pages_are_gateway_errors() -> None:
    assert "plain-text" in _failed("upstream request timeout", 504)["gateway-error"]
    assert "HTML error page" in _failed("<html><body>Oops</body></html>", 502)["gateway-error"]


def test_llama_servers_own_errors_and_good_replies_are_not_gateway_errors() -> None:
    own = {"error": {"code": 500, "message": "Failed to parse input at pos 3"}}
    assert "gateway-error" not in _failed(own, 500)
    unavailable = {"error": {"code": 503, "message": "Loading model", "type": "unavailable"}}
    assert "gateway-error" not in _failed(unavailable, 503)
    message = {"role": "assistant", "content": "ok"}
    good = {"choices": [{"message": message, "finish_reason": "stop"}]}
    assert _failed(good, 200) == {}
    assert "gateway-error" not in _failed({"error": {"message": "litellm.X"}}, 400)  # 4xx: client


def _reply(kinds: list[str], status: int | None = 504) -> Reply:
    return Reply("baseline", 0, 1000, True, kinds, None, 0, 0, status, 2.0, {})


def test_a_gateway_page_is_reproduced_through_the_gateway_or_by_a_crash_direct() -> None:
    findings = [Finding("gateway-error", False, 1.0, ""), Finding("timeout", False, 1.0, "")]
    signature = Signature.from_findings(findings, {"status": 504})
    assert signature.matches(_reply(["gateway-error", "http-error", "timeout"]))
    assert signature.matches(_reply(["server-crash", "SIGSEGV"], status=None))
    assert not signature.matches(_reply(["length-stop"], status=200))


# -- the arms and the rule ----------------------------------------------------------------


def test_the_gateway_arms_are_planned_only_with_a_gateway() -> None:
    with_gateway = {a.name: a for a in plan_arms(_stack(GATEWAY), REQUEST)}
    direct, streamed = with_gateway["gateway-direct"], with_gateway["gateway-streamed"]
    assert (direct.endpoint, direct.stream) == ("server", False)
    assert direct.decides == ("gateway-timeout",)
    assert (streamed.endpoint, streamed.stream) == ("client", True)
    assert with_gateway["baseline"].endpoint == "client"
    plain = _stack(SERVER)
    assert GatewayDirect().plan(plain, REQUEST) is None
    assert GatewayStreamed().plan(plain, REQUEST) is None


def _arm(name: str, failures: int, n: int, decision: str, **extra: Any) -> ArmOutcome:
    return ArmOutcome(name, n, failures, decision, p_value=0.001, **extra)


def _timeouts(name: str, times: list[float], passes: list[float] = ()) -> ArmOutcome:  # type: ignore[assignment]
    return _arm(
        name,
        len(times),
        len(times) + len(passes),
        "unchanged",
        kind_counts={"gateway-error": len(times), "timeout": len(times)},
        elapsed=tuple([*times, *passes]),
        failure_elapsed=tuple(times),
    )


def test_failures_that_end_at_one_time_whatever_the_variant_are_a_deadline() -> None:
    arms = {
        "baseline": _timeouts("baseline", [5.02, 4.98, 5.05, 5.0]),
        "thinking-off": _timeouts("thinking-off", [5.01, 4.97], passes=[3.1]),
    }
    deadline = fixed_deadline(arms)
    assert deadline is not None
    assert round(deadline.seconds, 1) == 5.0 and deadline.failures == 6
    assert deadline.variants == ("baseline", "thinking-off")
    assert "ends at 5.0+-0.0 s" in deadline.text() and "read timeout" in deadline.text()


def test_no_deadline_when_failures_spread_a_reply_passes_later_or_they_are_not_timeouts() -> None:
    assert fixed_deadline({"baseline": _timeouts("baseline", [2.0, 5.0, 9.0])}) is None
    assert fixed_deadline({"baseline": _timeouts("baseline", [2.0, 2.0, 2.0], [7.5])}) is None
    assert fixed_deadline({"baseline": _timeouts("baseline", [2.0, 2.0])}) is None  # too few
    parse = _arm(
        "baseline",
        4,
        4,
        "unchanged",
        kind_counts={"parse-failure": 4},
        elapsed=(0.3,) * 4,
        failure_elapsed=(0.3,) * 4,
    )
    assert fixed_deadline({"baseline": parse}) is None  # fast failures are not a deadline


def _obs(planned: tuple[str, ...]) -> Observations:
    return Observations(planned=planned)


PLANNED = ("baseline", "gateway-direct", "gateway-streamed")


def test_direct_removing_the_failure_confirms_it_with_the_deadline() -> None:
    arms = {
        "baseline": _timeouts("baseline", [2.0, 2.01, 1.99, 2.02, 2.0, 2.0, 2.01, 2.0]),
        "gateway-direct": _arm("gateway-direct", 0, 8, "removes", elapsed=(6.0,) * 8),
        "gateway-streamed": _arm("gateway-streamed", 0, 4, "removes", elapsed=(6.1,) * 4),
    }
    verdict = CAUSE.decide(arms, _obs(PLANNED))
    assert verdict.status == "confirmed" and verdict.deciding_probe == "gateway-direct"
    assert "0/8" in verdict.rationale and "8/8" in verdict.rationale
    assert "ends at 2.0+-0.0 s" in verdict.rationale
    assert "streamed through the gateway it passes" in verdict.rationale
    assert verdict.supports == ["gateway-direct", "gateway-streamed"]


def test_direct_failing_the_same_way_rejects_it() -> None:
    arms = {
        "baseline": _arm("baseline", 8, 8, "undecided", kind_counts={"http-error": 8}),
        "gateway-direct": _arm("gateway-direct", 8, 8, "unchanged", kind_counts={"http-error": 8}),
    }
    verdict = CAUSE.decide(arms, _obs(PLANNED))
    assert verdict.status == "rejected" and "passes the server's failure on" in verdict.rationale


def test_without_a_gateway_a_failure_that_reproduces_direct_rejects_it() -> None:
    arms = {"baseline": _arm("baseline", 6, 8, "undecided", kind_counts={"length-stop": 6})}
    verdict = CAUSE.decide(arms, _obs(("baseline",)))
    assert verdict.status == "rejected" and "no gateway in between" in verdict.rationale


def test_gateway_pages_from_a_server_url_leave_it_untested_and_say_how_to_test() -> None:
    arms = {"baseline": _timeouts("baseline", [2.0] * 4)}
    verdict = CAUSE.decide(arms, _obs(("baseline",)))
    assert (verdict.status, verdict.basis) == ("suspected", "untested")
    assert "[gateway].url" in verdict.deciding_probe


def test_nothing_moves_when_the_failure_does_not_reproduce() -> None:
    arms = {
        "baseline": _arm("baseline", 0, 8, "undecided"),
        "gateway-direct": _arm("gateway-direct", 0, 8, "no-baseline-failure"),
    }
    verdict = CAUSE.decide(arms, _obs(PLANNED))
    assert (verdict.status, verdict.basis) == ("suspected", "untested")


def test_a_deadline_is_a_floor_a_few_failures_may_end_later_never_earlier() -> None:
    # Measured under load: 28 replies ended at nginx's 1.5 s read timeout, one round of 4
    # ended half a second later (queued behind the other replays).
    arms = {
        "baseline": _timeouts("baseline", [1.55, 1.56, 1.56, 1.55, 2.12, 2.04, 2.04, 2.12]),
        "thinking-off": _timeouts("thinking-off", [1.56, 1.56, 1.56, 1.57]),
        "no-think-suffix": _timeouts("no-think-suffix", [1.58, 1.60, 1.60, 1.60]),
    }
    deadline = fixed_deadline(arms)
    assert deadline is not None
    assert round(deadline.seconds, 2) == 1.56 and deadline.failures == 12
    assert deadline.late == (2.04, 2.04, 2.12, 2.12)
    assert "12 of 16 failures through the gateway end at 1.6+-0.0 s" in deadline.text()
    assert "4 more ended later, at 2.0-2.1 s" in deadline.text()
    # Most failures late, or one failure earlier than the rest: no deadline.
    half = _timeouts("baseline", [1.5, 1.5, 1.5, 2.5, 2.6, 2.7, 3.0, 3.1])
    assert fixed_deadline({"baseline": half}) is None
