"""Adding a built-in cause is one new file in triage/engine/causes/ plus one entry point:
the cause below is planned (its arm decides it without naming it), decided by the shared
"this arm removes it" rule, and stored with the number its file declares, family bit
included -- with no change to kb/vocab.py, to a migration or to the engine."""

from __future__ import annotations

import importlib
import sys
import textwrap
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest
from sqlmodel import select

import triage.engine.causes as builtin_causes
from kb import vocab
from kb.domain.family import signature
from kb.models import Cause, Incident
from kb.repo.family import IncidentSignature, refresh_signatures, similar_incidents
from kb.repo.runs import CauseSpec, VerdictRow, apply_verdicts, ensure_causes
from kb.repo.store import Store
from triage.catalogue import Catalogue
from triage.catalogue.numbering import vocabulary
from triage.causes import ArmOutcome, Observations, decide
from triage.plugin_api import CauseEntry
from triage.probes import plan_arms
from triage.stackfile import parse_stack

REPO = Path(__file__).resolve().parents[2]
MODULE = "triage.engine.causes.fixture_cache_layout"
CAUSE_ID = "kv-cache-layout"
NUMBER = 31  # a free built-in number (0..31), declared in the cause's file only

SOURCE = f'''
"""{CAUSE_ID}: the KV cache layout (a test cause: one file, one entry point)."""

from triage.causes import CauseRule, Removal
from triage.plugin_api import Registry

CAUSE = CauseRule(
    id="{CAUSE_ID}",
    number={NUMBER},
    title="The KV cache layout",
    mechanism="the quantized cache's block layout corrupts attention",
    decided_by="the kv-f16 server arm",
    removed_by=("kv-f16",),
    removal=Removal(
        removes_text="an f16 KV cache removes the failure",
        unchanged_text="an f16 KV cache leaves the failure rate unchanged",
    ),
    retrospective="the KV cache layout broke attention",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
'''


@pytest.fixture
def new_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Catalogue]:
    """The new file beside the built-in causes, and its line in the entry points (a
    dist-info on sys.path: what `pip install -e .` leaves after the pyproject line)."""
    files = tmp_path / "causes"
    files.mkdir()
    (files / "fixture_cache_layout.py").write_text(textwrap.dedent(SOURCE))
    monkeypatch.setattr(builtin_causes, "__path__", [*builtin_causes.__path__, str(files)])
    info = tmp_path / "dist" / "triage_new_cause-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: triage-new-cause\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[triage.plugins]\ncause-{CAUSE_ID} = {MODULE}\n")
    sys.path.insert(0, str(info.parent))
    importlib.invalidate_caches()
    try:
        yield Catalogue.load()
    finally:
        sys.path.remove(str(info.parent))
        importlib.invalidate_caches()
        sys.modules.pop(MODULE, None)


def test_a_new_cause_file_is_planned_decided_and_stored_with_its_number(
    new_cause: Catalogue, tmp_path: Path, db_url: str
) -> None:
    cat = new_cause
    assert cat.causes.origin(CAUSE_ID) == f"cause-{CAUSE_ID}"
    assert vocabulary(cat).causes[CAUSE_ID] == NUMBER
    assert all(isinstance(cause, CauseEntry) for cause in cat.causes)  # the one contract

    # Planned: the kv-f16 arm decides it, though the arm's file never names it.
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    stack = parse_stack(
        '[server]\nmodel = "w.gguf"\nargs = ["-ctk", "q4_0", "-ctv", "q4_0"]\n', base=tmp_path
    )
    request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    planned = {a.name: a for a in plan_arms(stack, request, list(cat.arms), list(cat.causes))}
    assert planned["kv-f16"].decides == ("kv-cache-quant", CAUSE_ID)

    # Decided by the shared removal rule, with the engine's decide().
    arms = {
        "baseline": ArmOutcome("baseline", 8, 8, "baseline", kind_counts={"mojibake": 8}),
        "kv-f16": ArmOutcome("kv-f16", 8, 0, "removes", p_value=0.0002),
    }
    verdicts = {v.cause: v for v in decide(arms, Observations(planned=("kv-f16",)), cat.causes)}
    mine = verdicts[CAUSE_ID]
    assert (mine.status, mine.supports, mine.deciding_probe) == ("confirmed", ["kv-f16"], "kv-f16")
    assert mine.rationale.startswith("an f16 KV cache removes the failure: 0/8")
    unchanged = {**arms, "kv-f16": ArmOutcome("kv-f16", 8, 8, "unchanged", p_value=0.9)}
    again = {v.cause: v for v in decide(unchanged, Observations(planned=("kv-f16",)), cat.causes)}
    assert again[CAUSE_ID].status == "rejected"

    # Stored as the engine's recorder stores it, then numbered by the family refresh.
    store = Store(db_url)
    try:
        with store.session() as session:
            incident = Incident(slug="2026-07-01-layout", title="t", opened_on=date(2026, 7, 1))
            session.add(incident)
            session.flush()
            assert incident.id is not None
            ensure_causes(session, incident.id, [CauseSpec(CAUSE_ID, "The KV cache layout")], "t")
            apply_verdicts(
                session,
                incident.id,
                0,
                [VerdictRow(CAUSE_ID, mine.status, mine.rationale, [], [], "kv-f16")],
                "triage",
            )
        with store.session() as session:
            refresh_signatures(session, vocabulary=vocabulary(cat))
        with store.session(readonly=True) as session:
            row = session.exec(select(Cause).where(Cause.key == CAUSE_ID)).one()
            assert row.status == "confirmed"
            assert vocab.stored_numbers(session)["cause"][CAUSE_ID] == NUMBER
            sig = session.exec(select(IncidentSignature)).one()
            assert sig.causes_mask == 1 << NUMBER and not sig.stale
            found = similar_incidents(session, signature([], [CAUSE_ID], {}))
        assert [m.slug for m in found] == ["2026-07-01-layout"]
    finally:
        store.close()

    # Nothing but the new file and its entry point knows the cause.
    assert CAUSE_ID not in (REPO / "kb" / "vocab.py").read_text()
    migrations = (REPO / "kb" / "migrations" / "versions").glob("*.py")
    assert not any(CAUSE_ID in path.read_text() for path in migrations)


def test_every_declared_removal_arm_exists_and_decides_its_cause(tmp_path: Path) -> None:
    from triage.catalogue import catalogue

    cat = catalogue()
    declared = {c.id: c.removed_by for c in cat.causes if getattr(c, "removed_by", ())}
    assert declared == {
        "speculative-decoding": ("spec-off",),
        "server-build": ("alt-build",),
        "cpu-backend": ("no-repack",),
        "warmup-decode": ("no-warmup",),
        "cpu-threads": ("one-thread",),
        "kv-cache-quant": ("kv-f16",),
        "conversation-shape": ("history-normalised",),
        "model-file": ("alt-weights",),
        "quantized-weights": ("alt-weights",),
        "context-size": ("context-lifted",),
        "context-shift": ("context-shift-off",),
        "model-loop": ("anti-repetition",),
    }
    for arms in declared.values():
        assert all(arm in cat.arms for arm in arms)
    # The built-in arms already named these causes: declaring them changed no plan.
    (tmp_path / "w.gguf").write_bytes(b"GGUF")
    (tmp_path / "d.gguf").write_bytes(b"GGUF")
    (tmp_path / "alt.gguf").write_bytes(b"GGUF")
    stack = parse_stack(
        '[server]\nmodel = "w.gguf"\nargs = ["-md", "d.gguf", "-ctk", "q4_0"]\n'
        '[alternates]\nmodel = "alt.gguf"\n',
        base=tmp_path,
    )
    request = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 8}
    bare = [c for c in cat.causes if not getattr(c, "removed_by", ())]
    with_removals = {
        a.name: a.decides for a in plan_arms(stack, request, list(cat.arms), list(cat.causes))
    }
    without = {a.name: a.decides for a in plan_arms(stack, request, list(cat.arms), bare)}
    assert with_removals == without
    assert with_removals["spec-off"] == ("speculative-decoding",)
    assert with_removals["kv-f16"] == ("kv-cache-quant",)
    assert with_removals["alt-weights"] == ("quantized-weights", "model-file")
    assert with_removals["anti-repetition"] == ("model-loop", "reasoning-exhausts-budget")
