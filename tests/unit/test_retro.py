"""Retrospectives from the record: the reference story, citations that resolve, nothing
invented, inert markup, and the generated section of an incident file."""

from __future__ import annotations

import copy
import json
import re
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from kb.domain.retro import FACT_SECTIONS, retro_markdown
from kb.domain.retroformat import (
    SECTION_END,
    SECTION_START,
    replace_retro_section,
    retro_html,
    retro_section,
    strip_retro_section,
)
from kb.domain.retrotext import NO_EVIDENCE
from kb.repo.fileparse import parse_text
from kb.repo.files import import_paths, load_record, render_record
from kb.repo.store import Store

INCIDENTS = Path(__file__).resolve().parents[2] / "incidents"
REFERENCE = "2026-06-10-gemma4-empty-response"
CITATION_GROUP = re.compile(r"\\\[(?:\[[^\]]+\]\(#[\w-]+\)(?:, )?)+\\\]")
CITATION = re.compile(r"\[((?:\\.|[^\]\[\\])+)\]\(#([\w-]+)\)")
CODE_SPAN = re.compile(r"`[^`]*`")
SENTENCE_BREAK = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


@pytest.fixture(scope="module")
def reference() -> dict[str, Any]:
    store = Store("sqlite://")
    try:
        import_paths(store, [INCIDENTS])
        with store.session(readonly=True) as session:
            return load_record(session, REFERENCE)
    finally:
        store.close()


def sections(markdown: str, level: int = 2) -> dict[str, list[str]]:
    """Lines of each section at `level`, by title."""
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    marker = "#" * level + " "
    for line in markdown.splitlines():
        if line.startswith(marker):
            current = found.setdefault(line[len(marker) :].strip(), [])
        elif current is not None:
            current.append(line)
    return found


def plain(text: str) -> str:
    """Markdown text with citations, code spans and backslash escapes taken out."""
    text = CITATION_GROUP.sub("", text)
    return re.sub(r"\\(.)", r"\1", text)


def uncited_sentences(markdown: str, level: int = 2) -> list[str]:
    """Every sentence in the facts sections that does not end with a citation."""
    problems = []
    found = sections(markdown, level)
    for title in FACT_SECTIONS:
        for line in found.get(title, []):
            text = line.strip()
            if not text or text.startswith("|---") or text.startswith(">"):
                continue
            bare = text.lstrip("- ").strip()
            if bare.startswith("*") and not bare.startswith("**") and bare.endswith("*"):
                continue  # a statement about the record itself, set in italics
            if text.startswith("|"):
                if not text.startswith("| Hypothesis |") and not CITATION_GROUP.search(text):
                    problems.append(text)
                continue
            coded = CODE_SPAN.sub("CODE", text)
            parts = CITATION_GROUP.split(coded)
            if parts[-1].strip():
                problems.append(f"ends without a citation: {text}")
            # One citation per claim: sentences drawing on the same evidence share one
            # citation at their end, never the same one after each (issue 28).
            groups = [m.group(0) for m in CITATION_GROUP.finditer(coded)]
            for before, after in zip(groups, groups[1:], strict=False):
                if before == after:
                    problems.append(f"the same citation twice in a row: {text}")
    return problems


def claims(markdown: str) -> list[tuple[str, set[str]]]:
    """(sentence text, the evidence ids cited right after it), in order."""
    found, start = [], 0
    for line in markdown.splitlines():
        start = 0
        for match in CITATION_GROUP.finditer(line):
            found.append((plain(line[start : match.start()]).strip(), cited_ids(match.group(0))))
            start = match.end()
    return found


def cited_for(markdown: str, needle: str) -> set[str]:
    """The citation of the one sentence containing `needle`."""
    matching = [ids for text, ids in claims(markdown) if needle in text]
    assert len(matching) >= 1, needle
    assert all(ids == matching[0] for ids in matching), (needle, matching)
    return matching[0]


def cited_ids(markdown: str) -> set[str]:
    return {m.group(1).replace("\\", "") for m in CITATION.finditer(markdown)}


# --------------------------------------------------------------------------- the story


def test_reference_story_from_the_record(reference: dict[str, Any]) -> None:
    markdown = retro_markdown(reference)
    found = sections(markdown)
    # Fix options only for diagnosed incidents (arm measurements on record).
    assert [t for t in found if t in FACT_SECTIONS] == [
        t for t in FACT_SECTIONS if t != "Fix options"
    ]
    assert list(found)[:3] == ["Summary", "Impact", "Client's error"]

    # Summary: the confirmed cause, what was ruled out, the decision; each cited.
    summary = "\n".join(found["Summary"])
    assert cited_for(summary, "Thinking is on by default and the reasoning") == {"E9", "E10", "E11"}
    assert "**Ruled out:** The QAT Q4 weights made the model dumber." in summary
    assert "**Decision:** PARKED on 2026-06-10." in summary

    # Impact is quoted as recorded, labelled as uncited.
    impact = "\n".join(found["Impact"])
    assert "no evidence" in impact and "> Intermittent failures of agent sessions" in impact

    # The timeline: recorded events, no "suspected -> suspected" repeats.
    timeline = "\n".join(found["Timeline"])
    assert cited_for(timeline, "Quantization A/B (seed=42, 4 prompts)") == {"E6", "E7"}
    assert "**2026-06-05**: Google releases Gemma 4" in timeline

    # One line per cause, confirmed first, with its deciding numbers, each number cited.
    causes = [line for line in found["Causes"] if line]
    assert len([line for line in causes if line.startswith("- ")]) == len(reference["causes"])
    assert causes[0].startswith(
        "- **Thinking is on by default and the reasoning channel eats the token budget "
        "(`reasoning-exhausts-budget`), confirmed, measured**"
    )
    text = "\n".join(causes)
    assert "reasoning_len=2797, content_len=0, finish_reason=length" in plain(text)
    assert cited_for(text, "800-token budget): reasoning_len=2797") == {"E9"}
    assert cited_for(text, "/no_think: content_len=687, finish_reason=stop") == {"E10"}
    assert cited_for(text, "correct in 1.4 s") == {"E11"}
    quantization = next(line for line in causes if "`quantized-weights`" in line)
    assert "rejected, measured" in quantization and "$0.05" in quantization
    lossless = "Lossless means the distribution is preserved, not that the committed tokens"
    assert {"E14", "E17"} <= cited_for(text, lossless)
    assert cited_for(text, "80.8 -> 109.3 tok/s (+35%)") == {"E13"}
    assert cited_for(text, "The one AIME miss (738 correct, Gemma 657)") == {"E8"}

    # The decision: PARKED with the 35% tradeoff, citing the speed measurement, and the
    # way back (revisit date and triggers).
    decision = "\n".join(found["Decision"])
    assert "**PARKED on 2026-06-10 by operator**" in decision
    tradeoff = next(line for line in found["Decision"] if "Tradeoff" in line)
    assert "35% decode speed" in tradeoff and cited_ids(tradeoff) == {"E13"}
    assert cited_for(decision, "Gemma is non-core") == {"E21"}
    assert "Fix (not verified)" in decision and "revisit on 2026-09-10" in decision
    assert "new-build: A new llama.cpp build" in decision

    # Same failure family: the two Qwen incidents.
    family = "\n".join(found["Same failure family"])
    for slug in (
        "2026-05-01-qwen-echo-response-latency",
        "2026-05-01-qwen-internal-tool-run-to-completion",
    ):
        assert f"`{slug}`" in family
    assert "Same stack, different model (Qwen)" in family

    references = "\n".join(found["References"])
    assert "(<https://github.com/ggml-org/llama.cpp/issues/23335>)" in references

    # The evidence is linked, not inlined: one short entry per cited id.
    appendix = found["Evidence"]
    assert all(len(line) < 400 for line in appendix)


def test_every_sentence_in_the_facts_sections_cites_evidence_that_resolves(
    reference: dict[str, Any],
) -> None:
    markdown = retro_markdown(reference)
    assert uncited_sentences(markdown) == []
    assert NO_EVIDENCE not in markdown
    record_ids = {e["id"] for e in reference["evidence"]}
    appendix = sections(markdown)["Evidence"]
    entries = {line[len("### ") :] for line in appendix if line.startswith("### ")}
    cited = cited_ids(markdown)
    assert cited and cited <= record_ids
    assert entries == cited  # every citation has an entry, every entry is cited
    for match in CITATION.finditer(markdown):
        assert match.group(2) == match.group(1).replace(chr(92), "").lower()
    # The appendix quotes each cited evidence's summary (long ones cut short).
    by_id = {e["id"]: e for e in reference["evidence"]}
    appendix_text = plain("\n".join(appendix))
    for key in cited:
        assert " ".join(by_id[key]["summary"].split())[:150] in appendix_text

    html = retro_html(reference)
    ids = set(re.findall(r' id="([^"]+)"', html))
    hrefs = set(re.findall(r'href="#([^"]+)"', html))
    assert hrefs and hrefs <= ids


def test_the_citation_check_catches_uncited_sentences(reference: dict[str, Any]) -> None:
    markdown = retro_markdown(reference)
    doctored = markdown.replace(
        "## Causes\n\n",
        "## Causes\n\n- An uncited claim. Another one [[E1]](#evidence-e1).\n",
        1,
    )
    assert len(uncited_sentences(doctored)) == 1
    repeated = markdown.replace(
        "## Causes\n\n",
        "## Causes\n\n- A claim. \\[[E1](#e1)\\] Its second sentence. \\[[E1](#e1)\\]\n",
        1,
    )
    assert len(uncited_sentences(repeated)) == 1


def test_nothing_is_invented(reference: dict[str, Any]) -> None:
    """Every number in the generated facts is in the record."""
    markdown = retro_markdown(reference)
    found = sections(markdown)
    record_text = json.dumps(reference, ensure_ascii=False)
    for title in FACT_SECTIONS:
        text = plain(CODE_SPAN.sub("", "\n".join(found.get(title, []))))
        for number in re.findall(r"\d+(?:\.\d+)?", text):
            assert number in record_text, (title, number)


def test_arms_decisions_and_missing_evidence_are_shown(reference: dict[str, Any]) -> None:
    record = copy.deepcopy(reference)
    record["evidence"].append(
        {
            "id": "E22",
            "kind": "measurement",
            "summary": "arm baseline: 8/8 failed",
            "recorded_at": "2026-07-01T10:00:00Z",
            "payload": {
                "type": "arm",
                "arm": "revisit",
                "variant": "as sent",
                "n": 8,
                "failures": 8,
                "ci95": [0.6756, 1.0],
                "decision": "baseline",
            },
        }
    )
    record["decisions"].append(
        {
            "kind": "FIXED",
            "at": "2026-07-02T09:30:00Z",
            "by": "alice",
            "rationale": "restart [E22], not [E99].",
            "fix": "restart",
            "verified": False,
        }
    )
    markdown = retro_markdown(record)
    timeline = "\n".join(sections(markdown)["Timeline"])
    assert "**2026-07-01 10:00 UTC**: Probe arm revisit (as sent): 8/8 failed (100%)" in timeline
    assert "Decision FIXED (by alice), citing no evidence." in timeline
    decision = "\n".join(sections(markdown)["Decision"])
    # Ids the recorded text cites itself become links when the record has them.
    assert "*Why, as recorded: restart \\[[E22](#e22)\\], not \\[E99\\].*" in decision
    assert "Fix (not verified), as recorded: restart" in decision
    assert "\n### E22\n" in markdown and "### E99" not in markdown


def test_an_empty_record_says_so() -> None:
    markdown = retro_markdown(
        {"slug": "2026-01-01-x", "title": "x", "status": "open", "opened": "2026-01-01"}
    )
    assert "*No timeline is on record.*" in markdown
    assert "*No causes are on record.*" in markdown
    assert "*No captured exchange is on record.*" in markdown
    assert "*No evidence is cited.*" in markdown
    assert uncited_sentences(markdown) == []


# --------------------------------------------------------------------------- inert markup

HOSTILE = "<script>alert(1)</script> <img src=x onerror=alert(2)> [click](javascript:alert(3))"


class _Tags(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict[str, str | None]]] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))


ALLOWED_TAGS = {
    "html",
    "head",
    "meta",
    "title",
    "style",
    "body",
    "h1",
    "h2",
    "h3",
    "h4",
    "p",
    "ul",
    "li",
    "table",
    "thead",
    "tbody",
    "tr",
    "th",
    "td",
    "a",
    "strong",
    "em",
    "code",
    "blockquote",
}


def _hostile_record(reference: dict[str, Any]) -> dict[str, Any]:
    record = copy.deepcopy(reference)
    record["title"] = HOSTILE + "\n# injected heading"
    record["impact"] = HOSTILE
    record["symptoms"][0]["description"] = HOSTILE
    record["symptoms"][0]["observed"] = {"<b>k</b>": HOSTILE, "x": "`code` | pipe"}
    record["timeline"][0]["event"] = HOSTILE + "\n\n| fake | table |\n|---|---|"
    record["evidence"][0]["summary"] = HOSTILE
    record["evidence"][0]["source"] = "javascript:alert(4)"
    record["causes"][0]["title"] = "a | b " + HOSTILE
    record["causes"][0]["rationale"] = HOSTILE + " Second sentence <svg onload=alert(5)>."
    record["causes"][0]["evidence"][0]["note"] = HOSTILE
    record["causes"][0]["history"][0]["rationale"] = HOSTILE
    record["decisions"][0]["tradeoff"] = HOSTILE
    record["decisions"][0]["triggers"][0]["note"] = HOSTILE
    record["references"][0] = {"url": "javascript:alert(6)", "title": HOSTILE}
    record["references"][1]["title"] = "[x](javascript:alert(7))"
    record["references"][2]["url"] = "https://example.org/a>b)<script>alert(8)</script>"
    record["family"][0]["note"] = HOSTILE
    return record


def test_markup_in_recorded_text_is_inert_in_the_html(reference: dict[str, Any]) -> None:
    html = retro_html(_hostile_record(reference))
    parser = _Tags()
    parser.feed(html)
    assert {tag for tag, _ in parser.tags} <= ALLOWED_TAGS
    assert sum(1 for tag, _ in parser.tags if tag == "style") == 1
    for tag, attrs in parser.tags:
        assert not any(name.startswith("on") for name in attrs), (tag, attrs)
        if tag == "a":
            href = attrs.get("href") or ""
            assert href.startswith(("#", "https://", "http://")), href
    assert "<script" not in html.lower()
    assert "javascript:" not in " ".join(str(a.get("href")) for _, a in parser.tags)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html  # shown as text, not run
    assert "Content-Security-Policy" in html
    # Recorded text cannot open headings or tables of its own.
    markdown = retro_markdown(_hostile_record(reference))
    assert "\n# injected heading" not in markdown
    assert html.count("<h1") == 1
    assert "<td>fake</td>" not in html


# --------------------------------------------------------------------------- incident files


def test_generated_section_is_replaced_not_duplicated(reference: dict[str, Any]) -> None:
    section = retro_section(reference)
    assert section.startswith(SECTION_START) and section.rstrip().endswith(SECTION_END)
    assert "\n## Retrospective: " in section and "\n#### E9\n" in section
    body = replace_retro_section(reference["body"], section)
    assert body.startswith(reference["body"].rstrip("\n"))
    assert replace_retro_section(body, section) == body
    assert body.count(SECTION_START) == 1
    assert strip_retro_section(body) == reference["body"]

    # A changed record replaces the old section.
    changed = copy.deepcopy(reference)
    changed["decisions"][0]["tradeoff"] = "A different tradeoff."
    again = replace_retro_section(body, retro_section(changed))
    assert again.count(SECTION_START) == 1 and "A different tradeoff." in again
    assert "35% decode speed" not in again.split(SECTION_START)[1].split("Tradeoff")[1][:200]

    # Through the file format: the section survives a parse and regenerates identically.
    text = render_record({**reference, "body": body})
    parsed = parse_text(text, f"{REFERENCE}.md")
    assert parsed["body"] == reference["body"]  # the generated block is not part of the record
    assert replace_retro_section(parsed["body"], retro_section(parsed)) == body
    assert render_record(parsed) == text

    # No decision yet: no retrospective block.
    undecided = {**reference, "decisions": []}
    assert retro_section(undecided) == ""
    assert replace_retro_section(body, "") == reference["body"]


def test_generated_markers_render_as_nothing() -> None:
    from kb.domain.retroformat import markdown_renderer

    html = markdown_renderer().render(f"before\n\n{SECTION_START}\n\n{SECTION_END}\n\nafter\n")
    assert html == "<p>before</p>\n<p>after</p>\n"
