"""Issue 28 items 4 and 6: incidents named after the model (never the URL's host), and
explanations that say what is actually true (with the numbers)."""

from __future__ import annotations

from pathlib import Path

from triage.causes import ArmOutcome, observations_from
from triage.engine.causes import context_size as size_cause
from triage.engine.causes import parsing
from triage.engine.naming import identity_from_file, identity_from_server
from triage.stackfile import ServerConfig, Stack

SHORT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 64}


def _base(k: int, **kinds: int) -> ArmOutcome:
    counts = {key.replace("_", "-"): value for key, value in kinds.items()}
    return ArmOutcome("baseline", n=k, failures=k, decision="baseline", kind_counts=counts)


# --------------------------------------------------------------------------- naming


def test_a_url_servers_incident_is_named_after_its_model_file_not_its_host() -> None:
    path = "/models/SmolLM2-135M-Instruct-Q8_0.gguf"
    # llama-server's default alias is the model path itself.
    found = identity_from_server({"model_path": path, "model_alias": path})
    assert found.name == "SmolLM2-135M-Instruct-Q8_0"
    assert found.weights == "SmolLM2-135M-Instruct-Q8_0.gguf"
    # An alias set with --alias names it.
    assert identity_from_server({"model_path": path, "model_alias": "smollm2"}).name == "smollm2"
    # No /props: the first model /v1/models lists.
    models = {"data": [{"id": "gemma-3-270m-it.gguf"}]}
    assert identity_from_server(None, models).name == "gemma-3-270m-it"
    # Nothing known: a neutral word, never a host or a port.
    assert identity_from_server(None, None).name == "server"


def test_a_launched_servers_incident_is_named_after_the_gguf_file(tmp_path: Path) -> None:
    found = identity_from_file(tmp_path / "gemma-3-270m-it-Q8_0.gguf")
    assert (found.name, found.weights) == ("gemma-3-270m-it-Q8_0", "gemma-3-270m-it-Q8_0.gguf")


# --------------------------------------------------------------------------- output-parsing


def test_output_parsing_never_says_the_output_was_not_produced_for_full_replies() -> None:
    # 8 replies cut at max_tokens=64 with their content in the content field.
    verdict = parsing.CAUSE.decide(
        {"baseline": _base(8, length_stop=8)}, observations_from({}, None, speculative=False)
    )
    assert verdict.status == "rejected"
    assert "never produced" not in verdict.rationale
    assert "8 of them with content in the content field" in verdict.rationale


def test_output_parsing_says_the_answer_was_never_produced_only_for_empty_replies() -> None:
    verdict = parsing.CAUSE.decide(
        {"baseline": _base(8, length_stop=8, empty_content=8)},
        observations_from({}, None, speculative=False),
    )
    assert verdict.status == "rejected"
    assert "empty content" in verdict.rationale and "never produced" in verdict.rationale


# --------------------------------------------------------------------------- context-size


def _context_verdict(stack: Stack, request: dict, props_n_ctx: int | None = None) -> str:  # type: ignore[type-arg]
    facts = {"server-props": {"name": "server-props", "n_ctx_slot": props_n_ctx}}
    obs = observations_from(facts, stack, speculative=False, planned=("baseline",), request=request)
    verdict = size_cause.CAUSE.decide({"baseline": _base(8, length_stop=8)}, obs)
    assert verdict.status == "suspected" and verdict.basis == "untested"
    return verdict.rationale


def test_context_size_says_the_request_fits_with_the_numbers_when_c_is_set() -> None:
    stack = Stack(ServerConfig(None, "m.gguf", ("-c", "2048", "-np", "1")))
    text = _context_verdict(stack, SHORT, 2048)
    assert "no explicit -c" not in text
    assert "provably fits" in text and "2048-token slot context (-c 2048 / -np 1)" in text
    assert "max_tokens 64" in text and "/props reports a 2048-token slot context" in text


def test_context_size_on_a_url_stack_says_it_cannot_relaunch_the_server() -> None:
    stack = Stack(ServerConfig(url="http://127.0.0.1:8080"))
    text = _context_verdict(stack, SHORT, 2048)
    assert "no explicit -c" not in text and "provably fits" not in text
    assert "running server by URL" in text and "2048-token slot context" in text


def test_context_size_without_c_says_so() -> None:
    text = _context_verdict(Stack(ServerConfig(None, "m.gguf", ())), SHORT, 4096)
    assert "set no explicit -c" in text and "provably fits" not in text
