"""Multi-record captures (issue 18, defect 7): every bad JSONL line / HAR entry is named,
`--skip-bad` keeps the good records, and concatenated SSE streams are never merged."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from sqlmodel import select

from kb.models import Evidence
from kb.repo.store import Store
from triage.capture import CaptureError, PartialCapture, parse, parse_pair, parse_sse
from triage.cli import cli

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "captures"
RECORD = {
    "request": {"messages": [{"role": "user", "content": "hi"}]},
    "response": {"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]},
}


def jsonl(good: int, bad_lines: dict[int, str]) -> str:
    """`good` records with the given (1-based) line numbers replaced by bad text; each
    record asks something else (`triage capture` stores equal exchanges once)."""
    total = good + len(bad_lines)
    lines = [bad_lines.get(n, json.dumps(_numbered(n))) for n in range(1, total + 1)]
    return "\n".join(lines) + "\n"


def _numbered(n: int) -> dict[str, object]:
    return {**RECORD, "request": {"messages": [{"role": "user", "content": f"hi {n}"}]}}


def test_every_bad_jsonl_line_is_named():
    text = jsonl(1000, {4: "{not json", 500: '{"request": {}}', 1003: '{"request": {}, "resp'})
    with pytest.raises(PartialCapture) as info:
        parse(text, file="log.jsonl")
    error = info.value
    assert isinstance(error, CaptureError)  # all-or-nothing for every existing caller
    assert error.location == 4
    assert [e.location for e in error.errors] == [4, "line 500, $.response", 1003]
    message = str(error)
    assert message.startswith("log.jsonl:4: invalid JSON line")
    assert "line 500, $.response: record has no `response`" in message
    assert "line 1003: invalid JSON line" in message
    assert "(3 of 1003 records bad; --skip-bad keeps the 1000 good ones)" in message
    assert len(error.good) == 1000
    assert [ex.location for ex in error.good[:4]] == ["line 1", "line 2", "line 3", "line 5"]


def test_many_bad_lines_are_listed_with_a_bound():
    text = jsonl(2, {n: "nope" for n in range(3, 60)})
    with pytest.raises(PartialCapture) as info:
        parse(text, file="log.jsonl")
    assert len(info.value.errors) == 57
    assert "and 46 more" in str(info.value)
    assert len(str(info.value)) < 2000


def test_bad_har_entries_are_named_and_good_ones_kept():
    har = json.loads((FIXTURES / "agent-session.har").read_text(encoding="utf-8"))
    good = len(parse(json.dumps(har), file="a.har"))
    chat = [
        n
        for n, e in enumerate(har["log"]["entries"])
        if e["request"]["method"] == "POST" and "chat/completions" in e["request"]["url"]
    ]
    har["log"]["entries"][chat[0]]["request"]["postData"]["text"] = "{broken"
    with pytest.raises(PartialCapture) as info:
        parse(json.dumps(har), file="a.har")
    assert info.value.location == f"$.log.entries[{chat[0]}].request.postData.text"
    assert len(info.value.good) == good - 1


def run(*args: object):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def test_cli_default_is_all_or_nothing_and_skip_bad_keeps_the_good(tmp_path, monkeypatch):
    url = f"sqlite:///{tmp_path / 'kb.db'}"
    monkeypatch.setenv("TRIAGE_DATABASE_URL", url)
    path = tmp_path / "log.jsonl"
    path.write_text(jsonl(5, {3: "{oops", 7: '{"request": {}, "resp'}), encoding="utf-8")

    refused = run("capture", path)
    assert refused.exit_code == 1
    assert f"{path}:3: invalid JSON line" in refused.stderr
    assert "line 7: invalid JSON line" in refused.stderr

    checked = run("check", "--skip-bad", "--json", path)
    assert checked.exit_code == 0
    assert [item["location"] for item in json.loads(checked.stdout)] == [
        "line 1", "line 2", "line 4", "line 5", "line 6"
    ]  # fmt: skip
    assert f"warning: skipped {path}:3: invalid JSON line" in checked.stderr
    assert f"warning: skipped {path}:7: invalid JSON line" in checked.stderr

    stored = run("capture", "--skip-bad", path)
    assert stored.exit_code == 0, stored.output
    assert "stored 5 exchange(s)" in stored.stdout
    store = Store(url)
    try:
        with store.session(readonly=True) as session:
            assert len(session.exec(select(Evidence)).all()) == 5
    finally:
        store.close()


def test_skip_bad_with_nothing_good_still_fails(tmp_path):
    path = tmp_path / "log.jsonl"
    path.write_text("{oops\n[1]\n", encoding="utf-8")
    result = run("check", "--skip-bad", path)
    assert result.exit_code == 1
    assert "2 of 2 records bad" in result.stderr


def stream(words: list[str]) -> str:
    chunks = [
        {"choices": [{"index": 0, "delta": {"content": word}, "finish_reason": None}]}
        for word in words
    ]
    chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    return "".join(f"data: {json.dumps(chunk)}\n\n" for chunk in chunks) + "data: [DONE]\n\n"


def test_concatenated_sse_streams_are_two_exchanges_never_one_reply():
    text = stream(["Hello", " world"]) + stream(["Hello", " again"])
    exchanges = parse(text, file="two.sse")
    assert [ex.response["choices"][0]["message"]["content"] for ex in exchanges] == [
        "Hello world",
        "Hello again",
    ]
    assert [ex.index for ex in exchanges] == [0, 1]
    assert exchanges[1].location == "line 9"
    assert text.splitlines()[8].startswith("data: ")
    # the single-stream API refuses rather than merging
    with pytest.raises(CaptureError, match="holds 2 streams"):
        parse_sse(text, file="two.sse")
    # a response body (inside a pair) must be one reply
    with pytest.raises(CaptureError, match=r"data after `data: \[DONE\]`"):
        parse_pair("{}", text, file="r.sse")


def test_keepalive_comments_after_done_are_not_a_second_stream():
    text = stream(["Hi"]) + ": ping\n\n"
    assert len(parse(text, file="one.sse")) == 1
