"""Symptom checks come from the catalogue: a plugin installed through the `triage.plugins`
entry point alone runs on every capture, counts as user-facing, and has a stable number."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from plugin_dist import installed
from test_vocab import STORED_KINDS

from triage import symptoms
from triage.catalogue import Catalogue, CatalogueError, catalogue
from triage.checks import content, tools, transport

PLUGIN = '''
from triage.symptoms import Finding, check


@check("shouting", number=40)
def shouting(view):
    """Content written in capitals only."""
    for choice in view.choices:
        text = choice.content.strip()
        if len(text) > 3 and text.isupper():
            return [Finding("shouting", False, 1.0, "content is all capitals",
                            choice.content_path)]
    return [Finding("shouting", True, 0.0, "no shouting")]


def register(catalogue):
    catalogue.checks.add(shouting)
'''


def _reply(text: str) -> dict[str, object]:
    return {
        "request": {"messages": []},
        "response": {
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": text},
                }
            ]
        },
        "status": 200,
    }


@pytest.fixture
def installed_plugin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A distribution with one `triage.plugins` entry point, found on sys.path."""
    with installed(tmp_path, "shouting_plugin", PLUGIN):
        yield


def test_builtin_checks_are_registered_through_entry_points() -> None:
    checks = catalogue().checks
    # Registration order follows the entry-point names; KINDS are in number order.
    by_number = sorted(checks, key=lambda entry: entry.number)
    assert tuple(entry.id for entry in by_number) == symptoms.KINDS
    assert {checks.origin(kind) for kind in checks.ids()} == {
        "checks-content",
        "checks-context",
        "checks-reasoning",
        "checks-tools",
        "checks-transport",
        "checks-transport-server",
        "checks-wire-client",
        "checks-utf8-mojibake",
        "checks-gateway",
        "checks-server-flags",
        "checks-schema",
        "checks-embeddings",
        "checks-stream-format",
        "checks-prompt-prefix",
        "checks-repetition-loop",
        "checks-model-file",
        "checks-template-markup",
    }
    assert {entry.id: entry.number for entry in checks} == STORED_KINDS
    assert [c.id for c in checks if not c.user_facing] == [
        "runaway-reasoning",
        "chat-template-missing",
        "base-model-for-chat",
        "end-of-turn-mismatch",
        "unstable-prefix",
    ]
    for entry in checks:
        assert isinstance(entry, symptoms.Check)


@pytest.mark.usefixtures("installed_plugin")
def test_a_plugin_check_runs_on_every_capture() -> None:
    assert symptoms.KINDS[-1] == "shouting"
    assert "shouting" in symptoms.USER_FACING_KINDS
    findings = symptoms.classify(_reply("THE ANSWER IS NO"))
    assert [f.kind for f in findings] == list(symptoms.KINDS)
    assert symptoms.failure_kinds(_reply("THE ANSWER IS NO")) == {"shouting"}
    assert symptoms.is_failure(_reply("THE ANSWER IS NO"))
    assert not symptoms.is_failure(_reply("The answer is no."))
    assert catalogue().checks.numbers()["shouting"] == 40  # in the plugin range


def test_classify_without_the_plugin_does_not_report_it() -> None:
    assert "shouting" not in symptoms.KINDS
    assert not symptoms.is_failure(_reply("THE ANSWER IS NO"))


def test_classify_reads_the_catalogue_it_is_given() -> None:
    small = Catalogue()
    transport.register(small)
    kinds = [f.kind for f in symptoms.classify(_reply(""), catalogue=small)]
    assert kinds == ["parse-failure", "truncated-stream", "http-error", "timeout"]


def test_a_plugin_check_on_a_builtin_kind_or_number_is_refused() -> None:
    cat = Catalogue()
    for module in (content, tools, transport):
        cat.register_plugin(module.__name__, module.register)

    def clash(catalogue: Catalogue) -> None:
        catalogue.checks.add(symptoms.check("empty-content", number=40)(lambda view: []))

    with pytest.raises(CatalogueError, match="already registered by triage.checks.content"):
        cat.register_plugin("clash", clash)

    def low(catalogue: Catalogue) -> None:
        catalogue.checks.add(symptoms.check("my-kind", number=11)(lambda view: []))

    with pytest.raises(CatalogueError, match="numbers below 32"):
        cat.register_plugin("low", low)
    with pytest.raises(ValueError, match="needs a number"):
        symptoms.check("my-kind")
