"""Incident rows for the search, family and concurrency tests, written through the ORM.

The reference incident (Gemma 4, 2026-06-10) and two earlier Qwen incidents of the same
failure family, plus unrelated incidents that share words or stack with them.
"""

from __future__ import annotations

from datetime import date
from typing import Any

from sqlmodel import Session

from kb.models import Cause, Decision, Incident, Symptom
from kb.repo.store import add_evidence, record_status_change

REFERENCE = "2026-06-10-gemma4-empty-response"
QWEN = ("2025-11-03-qwen3-empty-content", "2026-02-17-qwen3-retry-spiral")


def add_incident(
    session: Session,
    slug: str,
    title: str,
    *,
    status: str = "open",
    summary: str = "",
    body: str = "",
    model: str = "",
    weights: str = "",
    server_build: str = "",
    flags: list[str] | None = None,
    stack: dict[str, Any] | None = None,
    symptoms: list[tuple[str, str]] = (),  # type: ignore[assignment]
    causes: list[tuple[str, str, str, str]] = (),  # type: ignore[assignment]
    evidence: list[str] = (),  # type: ignore[assignment]
    decisions: list[tuple[str, str, str, str]] = (),  # type: ignore[assignment]
) -> Incident:
    """One incident with its symptoms (kind, text), causes (id, status, title, rationale),
    evidence summaries and decisions (kind, rationale, tradeoff, fix)."""
    incident = Incident(
        slug=slug,
        title=title,
        opened_on=date.fromisoformat(slug[:10]),
        status=status,
        summary=summary,
        body=body,
        model=model,
        weights=weights,
        server_build=server_build,
        flags=list(flags or []),
        stack=dict(stack or {}),
    )
    session.add(incident)
    session.flush()
    assert incident.id is not None
    for summary_text in evidence:
        add_evidence(session, incident_id=incident.id, kind="measurement", summary=summary_text)
    for index, (kind, description) in enumerate(symptoms, 1):
        session.add(
            Symptom(incident_id=incident.id, key=f"S{index}", kind=kind, description=description)
        )
    for cause_id, cause_status, cause_title, rationale in causes:
        cause = Cause(
            incident_id=incident.id,
            key=cause_id,
            catalogue_id=cause_id,
            title=cause_title,
            status=cause_status,
            rationale=rationale,
        )
        record_status_change(session, cause, cause_status, actor="test", rationale=rationale)
    for kind, rationale, tradeoff, fix in decisions:
        session.add(
            Decision(
                incident_id=incident.id, kind=kind, rationale=rationale, tradeoff=tradeoff, fix=fix
            )
        )
    session.flush()
    return incident


def add_reference_incidents(session: Session) -> None:
    """The reference Gemma 4 incident, its Qwen family and four unrelated incidents."""
    add_incident(
        session,
        REFERENCE,
        "Gemma 4 behind llama-server: empty responses, broken tool calls, endless thinking",
        status="parked",
        summary=(
            "Under heavy agent use responses come back empty, tool-call JSON arrives broken, "
            "or the model thinks forever. Onset right after QAT weights, draft-MTP and a "
            "llama.cpp upgrade."
        ),
        body=(
            "The reasoning channel eats the token budget: reasoning_len=2797, content_len=0, "
            "finish_reason=length. With enable_thinking false content_len=687 and "
            "finish_reason=stop."
        ),
        model="gemma-4-31b-it",
        weights="gemma-4-31b-it-qat-q4_0.gguf",
        server_build="b9586",
        flags=["--jinja", "--spec-type", "draft-mtp"],
        stack={"thinking_default": True},
        symptoms=[
            ("empty-content", "Error: empty or unparsable response from the model"),
            ("tool-args-invalid-json", "tool-call JSON arrives broken"),
            ("runaway-reasoning", "the model thinks forever and diverges"),
        ],
        causes=[
            (
                "reasoning-exhausts-budget",
                "confirmed",
                "Thinking enabled by default eats the budget",
                "measured: thinking off gives content and finish_reason stop",
            ),
            (
                "quantized-weights",
                "rejected",
                "QAT Q4 made it dumber",
                "deterministic A/B seed=42: ties on 4 prompts",
            ),
            (
                "speculative-decoding",
                "suspected",
                "draft-MTP changes the committed token stream",
                "lossless means the distribution, not the stream",
            ),
        ],
        evidence=[
            "write a 120-char paragraph: reasoning_len=2797 content_len=0 finish_reason=length",
            "enable_thinking false + /no_think: content_len=687 finish_reason=stop",
            "A/B QAT vs MXFP4 seed=42: ties on reasoning, code, fact, Korean prompts",
        ],
        decisions=[
            (
                "PARKED",
                "Gemma is non-core; thinking default off is a strong, unverified fix candidate",
                "spec decoding +35% speed is not free",
                "",
            )
        ],
    )
    for slug, title in zip(
        QWEN,
        (
            "Qwen3 returns empty content with finish_reason length",
            "Qwen3 retry spiral: reasoning eats max_tokens",
        ),
        strict=True,
    ):
        add_incident(
            session,
            slug,
            title,
            status="fixed",
            summary="Reasoning consumed the whole token budget, content came back empty.",
            body="Turning thinking off server-side fixed it.",
            model="qwen3-30b-a3b",
            weights="Qwen3-30B-A3B-Q4_K_M.gguf",
            server_build="b6200",
            flags=["--jinja", "-c", "16384"],
            stack={"thinking_default": True},
            symptoms=[
                ("reasoning-exhausted-budget", "reasoning_content fills max_tokens"),
                ("empty-content", "content is an empty string"),
                ("length-stop", "finish_reason is length"),
            ],
            causes=[
                (
                    "reasoning-exhausts-budget",
                    "confirmed",
                    "Thinking on by default",
                    "enable_thinking false gives content",
                )
            ],
            decisions=[("FIXED", "thinking off by default", "", "--reasoning off on the server")],
        )
    add_incident(
        session,
        "2026-03-09-llama3-spec-json",
        "Llama 3 tool-call arguments broken with speculative decoding",
        status="fixed",
        summary="A changed token broke the tool-call JSON when a draft model was used.",
        model="llama-3.1-8b-instruct",
        server_build="b8000",
        flags=["-md", "draft.gguf"],
        stack={"thinking_default": False},
        symptoms=[("tool-args-invalid-json", "arguments are not valid JSON")],
        causes=[("speculative-decoding", "confirmed", "draft changes tokens", "spec off fixes")],
    )
    add_incident(
        session,
        "2026-04-01-mistral-timeouts",
        "Mistral timeouts under load",
        summary="Requests time out when all slots are busy; content is fine otherwise.",
        model="mistral-small-24b",
        server_build="b9000",
        symptoms=[("timeout", "client timeout after 600 s")],
    )
    add_incident(
        session,
        "2026-05-20-gemma3-parse-500",
        "Gemma 3: HTTP 500 does not match the expected format",
        status="open",
        summary="A hard parse failure after the parser upgrade.",
        model="gemma-3-27b-it",
        server_build="b9586",
        flags=["--jinja"],
        symptoms=[("parse-failure", "HTTP 500 from the chat parser"), ("http-error", "500")],
        causes=[("output-parsing", "confirmed", "parser regression", "older build parses it")],
    )
    add_incident(
        session,
        "2026-05-28-phi-length",
        "Phi: answers cut off at max_tokens",
        summary="Long answers stop with finish_reason length; max_tokens too low for content.",
        model="phi-4",
        server_build="b9600",
        symptoms=[("length-stop", "finish_reason length")],
        causes=[("token-limit", "confirmed", "max_tokens 256", "raising it fixes")],
    )
