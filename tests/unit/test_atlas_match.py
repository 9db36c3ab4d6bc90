"""The atlas matcher: a specific signature wins, a finding kind alone never matches, the
build range moves the score, verdicts move the pointer; facts from logs and captures."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from kb.atlas import Facts, family_in, load_atlas, match_atlas
from kb.atlas.match import THRESHOLD
from triage.atlas.facts import (
    facts_from_exchange,
    facts_from_exchange_dict,
    facts_from_log,
    facts_from_stack,
    merge_facts,
)
from triage.atlas.report import check_lines, format_matches, matches_for_record, read_log_file
from triage.capture import load_file
from triage.symptoms import classify

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "atlas"
ENTRIES = load_atlas([FIXTURES / "entries"])
AMX_LOG = (FIXTURES / "cases" / "amx-crash-log" / "server.log").read_text(encoding="utf-8")


def ids(facts: Facts) -> list[str]:
    return [m.entry.id for m in match_atlas(facts, ENTRIES)]


def capture_facts(case: str) -> Facts:
    exchange = load_file(FIXTURES / "cases" / case / "capture.json")[0]
    return facts_from_exchange(exchange, classify(exchange))


def test_the_amx_crash_log_matches_its_issue_with_the_facts_and_the_workaround() -> None:
    (match,) = match_atlas(facts_from_log(AMX_LOG), ENTRIES)
    assert match.entry.id == "llama.cpp-20824"
    kinds = {fact.kind for fact in match.facts}
    assert {"string", "cpu_flag", "build", "finding_kind"} <= kinds
    assert any("b11434 is inside" in fact.detail for fact in match.facts)
    assert "workaround: Start llama-server with --no-repack" in match.advice
    assert "upgrade llama.cpp to b11500 or later" in match.advice
    assert not match.past_fix


def test_log_facts() -> None:
    facts = facts_from_log(AMX_LOG)
    assert facts.build == 11434
    assert {"amx_int8", "avx512", "repack"} <= facts.cpu_flags and facts.cpu_flags_known
    assert "server-crash" in facts.finding_kinds
    assert {"-m", "-c", "--port", "-lv"} <= facts.server_flags
    assert "gemma4" in facts.models and family_in("gemma-4", facts.models)
    assert "backtrace in ggml_backend_amx_mul_mat" in facts.notes


def test_build_info_and_version_lines() -> None:
    assert facts_from_log("build_info: b9589-abcdef\n").build == 9589
    assert facts_from_log("version: 4369 (21ae3b9b)\nbuilt with Apple clang\n").build == 4369
    assert facts_from_log("nothing here\n").build is None


def test_a_specific_error_string_wins_over_a_relative_with_the_same_status() -> None:
    assert ids(capture_facts("jinja-capture")) == ["ramalama-988"]
    assert ids(capture_facts("old-tools-capture")) == ["llama.cpp-10920"]


def test_a_finding_kind_alone_never_matches() -> None:
    every_kind = frozenset(k for e in ENTRIES for k in e.signatures.finding_kinds)
    facts = Facts(source="capture", finding_kinds=every_kind, http_status=frozenset({500}))
    assert match_atlas(facts, ENTRIES) == []
    # ...nor a generic crash log that shares only the crash kind with the AMX entry
    other = (FIXTURES / "cases" / "other-crash-log" / "server.log").read_text(encoding="utf-8")
    assert ids(facts_from_log(other)) == []


def test_kinds_need_two_context_facts_without_a_signature_string() -> None:
    assert ids(capture_facts("gemma-empty-no-context")) == []  # kinds + model only
    assert ids(capture_facts("gemma-empty-open-webui")) == ["ollama-15288"]  # + the client


def test_another_model_family_lowers_the_score() -> None:
    facts = capture_facts("gemma-empty-open-webui")
    qwen = replace(facts, models=("Qwen3-30B-A3B",))
    assert ids(qwen) == []


def test_build_range_inside_outside_and_past_the_fix() -> None:
    log = facts_from_log(AMX_LOG)
    inside = match_atlas(log, ENTRIES)[0]
    before = match_atlas(replace(log, build=8000), ENTRIES)[0]
    past = match_atlas(replace(log, build=11500), ENTRIES)[0]
    unknown = match_atlas(replace(log, build=None), ENTRIES)[0]
    assert inside.score > unknown.score > before.score > past.score >= THRESHOLD
    assert any("outside affected b9000..b11434" in f.detail for f in before.facts)
    assert past.past_fix and past.advice[0].startswith("you are past the fix (b11500 >= b11500)")
    assert not any(a.startswith("upgrade") for a in past.advice)


def test_past_the_fix_without_a_strong_signature_drops_the_match() -> None:
    facts = replace(capture_facts("old-tools-capture"), build=None)
    assert ids(facts) == ["llama.cpp-10920"]
    # affected_to 4369 and no fix known: a build far past it is outside the range
    assert match_atlas(merge_facts(facts_from_stack(build=11434), facts), ENTRIES)[0].score < (
        match_atlas(facts, ENTRIES)[0].score
    )


def test_a_missing_cpu_flag_on_a_host_that_read_its_flags_lowers_the_score() -> None:
    log = facts_from_log(AMX_LOG)
    no_amx = replace(log, cpu_flags=frozenset({"avx2"}))
    assert match_atlas(no_amx, ENTRIES)[0].score < match_atlas(log, ENTRIES)[0].score - 2.5


def test_a_confirmed_cause_raises_and_a_rejected_one_lowers_the_pointer() -> None:
    log = facts_from_log(AMX_LOG)
    base = match_atlas(log, ENTRIES)[0].score
    confirmed = match_atlas(replace(log, confirmed_causes=frozenset({"cpu-backend"})), ENTRIES)
    rejected = match_atlas(replace(log, rejected_causes=frozenset({"cpu-backend"})), ENTRIES)
    assert confirmed[0].score == base + 1.5
    assert "cause cpu-backend confirmed by the diagnosis" in [f.detail for f in confirmed[0].facts]
    assert rejected[0].score == base - 2.0


def test_a_string_shared_by_several_entries_weighs_less() -> None:
    twin = replace(ENTRIES[0], id="twin", signatures=ENTRIES[1].signatures)  # 20824's log string
    facts = facts_from_log(AMX_LOG)
    alone = match_atlas(facts, ENTRIES)[0]
    shared = {m.entry.id: m for m in match_atlas(facts, [*ENTRIES, twin], top=None)}
    assert shared["llama.cpp-20824"].score == alone.score - 1.5


def test_family_names() -> None:
    assert family_in("gemma-4", ["gemma-4-31B-it-Q4_K_M.gguf"])
    assert family_in("gemma-4", ["Gemma4"])
    assert not family_in("gemma-4", ["gemma-40b"])
    assert family_in("qwen3", ["qwen3moe"])
    assert not family_in("qwen3", ["Qwen3.5-9B"])


def test_printed_lines_say_why_and_what_to_do() -> None:
    matches = match_atlas(facts_from_log(AMX_LOG), ENTRIES)
    text = "\n".join(format_matches(matches, len(ENTRIES)))
    assert "llama.cpp-20824  score" in text and "a pointer, not a verdict" in text
    assert "matched: 'ggml_backend_amx_mul_mat' found" in text
    assert "-> workaround: Start llama-server with --no-repack" in text
    assert format_matches([], 4) == ["Known public incidents (atlas): no match among 4 entries"]
    assert check_lines(["a#0"], [[]], 4) == format_matches([], 4)


def test_a_stored_incident_record_matches_from_its_evidence() -> None:
    exchange = load_file(FIXTURES / "cases" / "jinja-capture" / "capture.json")[0]
    record = {
        "symptoms": [],
        "evidence": [
            {"kind": "note", "payload": {"text": "first"}},
            {
                "kind": "exchange",
                "payload": {"exchange": exchange.to_dict(), "symptoms": ["http-error"]},
            },
        ],
        "causes": [{"id": "server-flags", "status": "confirmed"}],
    }
    (match,) = matches_for_record(record, ENTRIES)
    assert match.entry.id == "ramalama-988"
    assert "finding http-error" in [f.detail for f in match.facts]
    assert "cause server-flags confirmed by the diagnosis" in [f.detail for f in match.facts]


def test_a_secret_in_a_logged_error_is_not_printed() -> None:
    secret = "sk-" + "a1B2c3D4e5F6g7H8i9J0" * 2
    log = f"0.00.414.869 E srv  load: error: invalid api key {secret}\nSegmentation fault\n"
    facts = facts_from_log(log)
    assert facts.notes and all(secret not in note for note in facts.notes)
    assert any(note.startswith("first error: ") for note in facts.notes)


def test_a_signature_quoted_in_the_echoed_prompt_does_not_match() -> None:
    reply = {
        "choices": [{"index": 0, "finish_reason": "stop", "message": {"content": "Sure."}}],
        "__verbose": {"prompt": "user: why does it say tools param requires --jinja flag?"},
    }
    facts = facts_from_exchange_dict({"request": {}, "response": reply, "status": 500}, [])
    assert all("requires --jinja" not in text for text in facts.texts)
    assert ids(replace(facts, finding_kinds=frozenset({"http-error"}))) == []


def test_a_hostile_log_is_read_bounded(tmp_path: Path) -> None:
    # one 600 KB line without spaces that mentions .gguf, then the AMX crash at the end
    hostile = "x" * 600_000 + ".gguf" + "y" * 10 + "\n" + "\x00\xff garbage\n" + AMX_LOG
    path = tmp_path / "server.log"
    path.write_text(hostile, encoding="utf-8")
    facts = facts_from_log(read_log_file(path))
    assert ids(facts) == ["llama.cpp-20824"]  # the tail is still read
    assert all(len(model) <= 4000 for model in facts.models)


def test_a_model_alias_no_family_matches_is_no_evidence_against() -> None:
    entries = [
        replace(e, models=("qwen3",)) if e.id == "ramalama-988" else e for e in ENTRIES
    ]  # families the atlas knows: qwen3 and gemma-4
    facts = capture_facts("jinja-capture")

    def score(*models: str) -> float:
        return match_atlas(replace(facts, models=models), entries)[0].score

    assert score("qwen3-32b") == score() + 1.0  # its family
    assert score("gpt-4") == score()  # an alias: neither for nor against
    assert score("gemma-4-31b-it") == score() - 1.0  # another family the atlas knows
