"""Capture formats come from the catalogue: the built-ins through their entry points, and a
plugin format is accepted by detection, `parse`, validation and the CLI's `--format`."""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

import pytest
from click.testing import CliRunner

import triage.catalogue
from triage import capture
from triage.capture import (
    CaptureError,
    CaptureFormat,
    Exchange,
    detect_format,
    exchange_from_record,
    format_ids,
    load_file,
    parse,
    validate_exchange,
)
from triage.catalogue import ENTRY_POINT_GROUP, Catalogue
from triage.cli import cli

BUILTIN = {"pair", "curl", "sse", "har", "jsonl"}
OK = {"choices": [{"index": 0, "message": {"role": "assistant", "content": ""}}]}


def _parse_toylog(text: str, *, file: str, base_dir: Path | None) -> list[Exchange]:
    """A toy proxy log: a `TOYLOG` line, then one `request<TAB>response` JSON pair per line."""
    exchanges = []
    for number, line in enumerate(text.splitlines()[1:], start=2):
        if not line.strip():
            continue
        request, sep, response = line.partition("\t")
        if not sep:
            raise CaptureError(file, number, "expected request<TAB>response")
        record = {"request": json.loads(request), "response": json.loads(response)}
        exchanges.append(
            exchange_from_record(
                record, file=file, source_format="toylog", index=len(exchanges), line=number
            )
        )
    return exchanges


TOYLOG = CaptureFormat(
    id="toylog",
    label="toy proxy log",
    suffixes=(".toylog",),
    priority=5,
    sniff=lambda text: text.startswith("TOYLOG"),
    parse=_parse_toylog,
)


def _register_toylog(catalogue: Catalogue) -> None:
    catalogue.formats.add(TOYLOG)


@pytest.fixture()
def with_plugin(monkeypatch: pytest.MonkeyPatch) -> Catalogue:
    """The installed plugins plus a third-party entry point naming the toy format's
    register function (exactly what another package's pyproject would declare), loaded the
    way `triage.catalogue.catalogue()` loads them."""
    third_party = metadata.EntryPoint(
        name="toylog-plugin", value=f"{__name__}:_register_toylog", group=ENTRY_POINT_GROUP
    )
    installed = list(metadata.entry_points(group=ENTRY_POINT_GROUP))
    loaded = Catalogue.load([*installed, third_party])
    assert loaded.formats.origin("toylog") == "toylog-plugin"
    monkeypatch.setattr(triage.catalogue, "catalogue", lambda: loaded)
    return loaded


def toylog_text(secret: str = "sk-plugin-canary-0123456789") -> str:
    request = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "api_key": secret}
    return "TOYLOG v1\n" + json.dumps(request) + "\t" + json.dumps(OK) + "\n"


def test_builtin_formats_are_registered_through_entry_points():
    loaded = Catalogue.load()
    assert BUILTIN <= set(loaded.formats.ids())
    for format_id in BUILTIN:
        assert loaded.formats.origin(format_id) == f"capture-{format_id}"
        entry = loaded.formats[format_id]
        assert isinstance(entry, CaptureFormat) and entry.label and "\n" not in entry.label
    assert set(capture.FORMATS) == set(format_ids()) >= BUILTIN
    # Sniff order is by priority; pair is the fallback, tried last.
    assert format_ids()[-1] == "pair"


def test_plugin_format_is_detected_by_suffix_and_by_sniffing(with_plugin):
    text = toylog_text()
    assert detect_format(text, "capture.toylog") == "toylog"
    assert detect_format(text, "capture.txt") == "toylog"
    assert detect_format("garbage", "x.toylog") == "toylog"
    assert "toylog" in capture.FORMATS


def test_plugin_format_parses_through_parse_and_load_file(with_plugin, tmp_path):
    path = tmp_path / "proxy.toylog"
    path.write_text(toylog_text(), encoding="utf-8")
    for exchanges in (parse(toylog_text(), file="p.toylog"), load_file(path)):
        assert len(exchanges) == 1
        ex = exchanges[0]
        assert ex.source_format == "toylog"
        assert ex.location == "line 2"
        assert validate_exchange(ex.to_dict()) == []
        # The plugin used the public builder: its output is redacted like any capture.
        assert "sk-plugin-canary" not in json.dumps(ex.to_dict())
    assert parse(toylog_text(), format="toylog", file="p")[0].source_format == "toylog"


def test_unregistered_format_is_refused_everywhere():
    with pytest.raises(CaptureError, match="unknown format 'toylog'"):
        parse(toylog_text(), format="toylog", file="p")
    data = parse_ok_pair().to_dict()
    data["source_format"] = "toylog"
    errors = validate_exchange(data)
    assert errors and errors[0][0] == "$.source_format"
    assert "not a registered capture format" in errors[0][1]


def parse_ok_pair() -> Exchange:
    return parse(json.dumps({"request": {"messages": []}, "response": OK}), file="p.json")[0]


def test_plugin_format_is_a_valid_stored_source_format(with_plugin):
    data = parse_ok_pair().to_dict()
    data["source_format"] = "toylog"
    assert validate_exchange(data) == []
    assert Exchange.from_dict(data).source_format == "toylog"


def test_cli_format_choice_reads_the_registry(with_plugin, tmp_path):
    path = tmp_path / "proxy.log"
    path.write_text(toylog_text(), encoding="utf-8")
    result = CliRunner().invoke(cli, ["check", "--format", "toylog", "--json", str(path)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)[0]["format"] == "toylog"
    help_text = CliRunner().invoke(cli, ["check", "--help"]).output
    assert "toylog" in help_text


def test_cli_refuses_a_format_no_plugin_registered(tmp_path):
    path = tmp_path / "proxy.log"
    path.write_text(toylog_text(), encoding="utf-8")
    result = CliRunner().invoke(cli, ["check", "--format", "toylog", str(path)])
    assert result.exit_code == 2
    assert "'toylog' is not one of" in result.output


def test_a_plugin_returning_garbage_or_a_broken_sniffer_gives_a_capture_error(monkeypatch):
    loaded = Catalogue.load()

    def bad_sniff(text: str) -> bool:
        raise ZeroDivisionError

    def register(catalogue: Catalogue) -> None:
        catalogue.formats.add(
            CaptureFormat("broken", "broken", (".broken",), 1, bad_sniff, lambda t, **k: "x")
        )

    loaded.register_plugin("broken-plugin", register)
    monkeypatch.setattr(triage.catalogue, "catalogue", lambda: loaded)
    with pytest.raises(CaptureError, match="format 'broken' failed to sniff"):
        detect_format("anything", "x.txt")
    with pytest.raises(CaptureError, match="did not return a list of exchanges"):
        parse("anything", file="x.broken")


def test_capture_package_rooms_stay_small():
    import ast

    root = Path(capture.__file__).parent
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        assert text.count("\n") <= 800, path
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                assert node.end_lineno - node.lineno + 1 <= 80, f"{path}:{node.name}"
