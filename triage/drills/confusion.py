"""The confusion table: every drill x every catalogue cause -> verdict, against the manifests.

    python -m triage.drills.confusion [--drills a,b] [--max-requests N] [--json FILE]
    make confusion [CONFUSION_ARGS="--drills model-file-token-type"]

Builds each drill of the registry (or the named ones) into a throwaway folder, diagnoses its
first failing request on the real llama-server into a throwaway SQLite store, and prints a
Markdown table: one row per drill, one column per cause, each cell the verdict with the
deciding arm's k/n, marked against the drill's manifest:

  ok        the verdict is one the manifest accepts (or, for a cause the manifest does not
            list, anything but confirmed);
  MISMATCH  the manifest expects another verdict;
  OFF-DIAG  confirmed although the manifest does not expect this cause to be confirmed.

Exits 1 on any off-diagonal confirmation, expected-verdict mismatch or failed diagnosis, 0
otherwise. The table logic (`evaluate`, `render`, `exit_code`) is pure; `run` is the only part
that starts servers.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from kb.jsontypes import JsonObject
from kb.repo.store import Store
from triage import catalogue as plugins
from triage.capture import load_file
from triage.drills.registry import CAPTURE_RECORDERS, SERVED, build_drill, list_drills
from triage.engine import DiagnoseOptions, Intake, diagnose
from triage.stackfile import load_stack

OK = "ok"
MISMATCH = "MISMATCH"
OFF_DIAGONAL = "OFF-DIAG"
MISSING = "MISSING"  # the manifest lists a cause the diagnosis has no verdict for
NOT_RUN = "n/a"  # the cause was not part of this run (e.g. crash-only causes), not listed
CONFIRMED = "confirmed"
VERDICT = "(verdict)"  # the column of a drill whose manifest names an expected_verdict
FIELDS = "(request fields)"  # ... and of one that names expected_request_fields
# Replays per arm: a deterministic failure is decided in a few, an intermittent one needs more.
DETERMINISTIC_CAP = 16
INTERMITTENT_CAP = 64


@dataclass
class Cell:
    """One drill x cause verdict, marked against the manifest."""

    cause: str
    status: str  # confirmed | suspected | rejected | "" (no verdict in this run)
    deciding: str = ""  # "arm k/n" of the deciding probe, when it is an arm that ran
    expected: str = ""  # the manifest's expected verdict ("" = the manifest does not list it)
    accept: tuple[str, ...] = ()
    mark: str = OK

    def text(self) -> str:
        status = self.status or "-"
        body = f"**{status}**" if status == CONFIRMED else status
        if self.deciding:
            body += f" ({self.deciding})"
        return body if self.mark == OK else f"{body} {self.mark}"


@dataclass
class Row:
    """One drill: its cells, or the error that stopped its diagnosis."""

    drill: str
    request: str = ""
    cells: list[Cell] = field(default_factory=list)
    error: str = ""
    seconds: float = 0.0
    requests: int = 0  # replays the diagnosis sent (its cost), for the cost tables

    @property
    def problems(self) -> list[Cell]:
        return [cell for cell in self.cells if cell.mark != OK]


def _accepted(truth: Mapping[str, object]) -> tuple[str, tuple[str, ...]]:
    expected = str(truth.get("expected", ""))
    accept = truth.get("accept")
    if isinstance(accept, list) and accept:
        return expected, tuple(str(a) for a in accept)
    if expected == "not-confirmed":
        return expected, ("rejected", "suspected")
    return expected, (expected,)


def _deciding(cause: JsonObject, arms: dict[str, JsonObject]) -> str:
    arm = arms.get(str(cause.get("deciding_probe") or ""))
    if not arm or not arm.get("n"):
        return ""
    text = f"{arm['name']} {arm['failures']}/{arm['n']}"
    base = arms.get("baseline")
    if arm["name"] != "baseline" and base and base.get("n"):
        text += f" vs {base['failures']}/{base['n']}"
    return text


def evaluate(drill: str, manifest: JsonObject, diagnosis: JsonObject, causes: Sequence[str]) -> Row:
    """Mark each cause's verdict in `diagnosis` (its JSON) against the drill's `manifest`."""
    verdicts = {str(c["id"]): c for c in diagnosis.get("causes") or []}
    arms = {str(a["name"]): a for a in diagnosis.get("arms") or []}
    truths: JsonObject = manifest.get("causes") or {}  # as manifest.json holds them
    row = Row(drill)
    for cause_id in [*causes, *sorted(set(truths) - set(causes))]:
        verdict = verdicts.get(cause_id)
        status = str(verdict["status"]) if verdict else ""
        cell = Cell(cause_id, status, _deciding(verdict, arms) if verdict else "")
        if cause_id in truths:
            cell.expected, cell.accept = _accepted(truths[cause_id])
            if not status:
                cell.mark = MISSING
            elif status == CONFIRMED and cell.expected != CONFIRMED:
                cell.mark = OFF_DIAGONAL
            elif status not in cell.accept:
                cell.mark = MISMATCH
        elif status == CONFIRMED:
            cell.mark = OFF_DIAGONAL
        elif not status:
            cell.status, cell.mark = "", OK
        row.cells.append(cell)
    expected_verdict = manifest.get("expected_verdict")
    if expected_verdict:  # e.g. "unexplained": a real failure no catalogue cause explains
        status = str((diagnosis.get("verdict") or {}).get("status", ""))
        mark = OK if status == expected_verdict else MISMATCH
        row.cells.append(
            Cell(VERDICT, status, "", str(expected_verdict), (str(expected_verdict),), mark)
        )
    expected_fields = manifest.get("expected_request_fields")
    if expected_fields:  # the request fields whose ablation removes the failure (issue 23)
        named = (diagnosis.get("verdict") or {}).get("request_fields") or []
        found = sorted({str(f).split(" ", 1)[0] for f in named})
        want = sorted(str(f) for f in expected_fields)
        mark = OK if found == want else MISMATCH
        text = ", ".join(found) or "none"
        detail = "; ".join(str(f).split(" ", 1)[1].strip("()") for f in named if " " in str(f))
        row.cells.append(Cell(FIELDS, text, detail, ", ".join(want), (text,), mark))
    return row


def exit_code(rows: Iterable[Row]) -> int:
    """1 when any drill failed to diagnose or any cell is not as the manifest says."""
    return 1 if any(row.error or row.problems for row in rows) else 0


def render(rows: Sequence[Row], causes: Sequence[str]) -> str:
    """The Markdown table plus a one-line summary per kind of problem."""
    columns = list(causes)
    for row in rows:
        columns += [c.cause for c in row.cells if c.cause not in columns]
    lines = [
        "| drill | " + " | ".join(columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    for row in rows:
        if row.error:
            lines.append(f"| {row.drill} | " + f"ERROR: {row.error[:200]}" + " |" * len(columns))
            continue
        by_cause = {c.cause: c for c in row.cells}
        cells = [by_cause[c].text() if c in by_cause else NOT_RUN for c in columns]
        lines.append(f"| {row.drill} | " + " | ".join(cells) + " |")
    off = sum(1 for row in rows for c in row.problems if c.mark == OFF_DIAGONAL)
    bad = sum(1 for row in rows for c in row.problems if c.mark in (MISMATCH, MISSING))
    errors = sum(1 for row in rows if row.error)
    lines += [
        "",
        f"drills: {len(rows)}; off-diagonal confirmations: {off}; expected-verdict "
        f"mismatches: {bad}; failed diagnoses: {errors}",
        "(cell: verdict (deciding arm failures/n vs baseline failures/n); unmarked = as "
        "the manifest expects, "
        f"{OFF_DIAGONAL} = confirmed but not expected, {MISMATCH} = not the manifest's "
        f"verdict, {NOT_RUN} = not decided in this run)",
    ]
    return "\n".join(lines)


def failing_request(manifest: JsonObject) -> tuple[str, int]:
    """(name of the drill's first failing request, the per-arm replay cap it needs)."""
    requests = manifest.get("requests") or []
    chosen = next((r for r in requests if r.get("role") == "failing"), None)
    if chosen is None:
        raise ValueError(f"drill {manifest.get('drill')}: manifest has no failing request")
    rate = (chosen.get("expect") or {}).get("failure_rate")
    cap = DETERMINISTIC_CAP if rate == 1.0 else INTERMITTENT_CAP
    return str(chosen["name"]), cap


def catalogue_causes() -> list[str]:
    """Catalogue cause ids by stable number (crash-only causes are decided in crash runs)."""
    return [str(c.id) for c in sorted(plugins.catalogue().causes, key=lambda c: int(c.number))]


def _recorded_capture(drill: Any, work: Path) -> Intake | None:
    """For a drill whose failure is in a capture (see registry.CAPTURE_RECORDERS): the
    recorded exchange, classified as `triage diagnose FILE` would; None for a drill
    diagnosed from its request alone."""
    recorder = CAPTURE_RECORDERS.get(drill.name)
    if recorder is None:
        return None
    (exchange,) = load_file(recorder(drill, work))
    return Intake.of(exchange)


def run_drill(
    name: str,
    work: Path,
    causes: Sequence[str],
    max_requests: int | None,
    *,
    preconditions: bool = True,
) -> Row:
    """Build drill `name` in `work`, diagnose its failing request, return its row."""
    started = time.monotonic()
    try:
        drill = build_drill(name, work / "drill")
        request, cap = failing_request(drill.manifest)
        with ExitStack() as services:
            stack_path, capture = drill.out_dir / "stack.toml", _recorded_capture(drill, work)
            if drill.name in SERVED:  # a running server behind a real gateway or proxy
                served = services.enter_context(SERVED[drill.name](drill, work / "served"))
                stack_path = served.stack_path
                capture = Intake(served.request, served.exchange, tuple(served.findings))
            body = drill.request(request)
            # A drill whose replies never end (context shift) names the replay timeout.
            timeout = float(drill.manifest.get("replay_timeout") or DiagnoseOptions.request_timeout)
            store = Store(f"sqlite:///{work / 'kb.db'}")
            try:
                diagnosis = diagnose(
                    store,
                    capture or Intake(body),
                    load_stack(stack_path),
                    options=DiagnoseOptions(
                        max_requests=max_requests or cap,
                        log_dir=work / "runs",
                        request_timeout=timeout,
                        check_preconditions=preconditions,
                    ),
                )
            finally:
                store.close()
    except Exception as exc:  # noqa: BLE001 - one drill's failure is a row, not a traceback
        return Row(name, error=f"{type(exc).__name__}: {exc}", seconds=time.monotonic() - started)
    row = evaluate(name, drill.manifest, diagnosis.to_json(), causes)
    row.request, row.seconds = request, time.monotonic() - started
    row.requests = diagnosis.cost.requests if diagnosis.cost else 0
    return row


def run(
    names: Sequence[str], max_requests: int | None = None, *, preconditions: bool = True
) -> list[Row]:
    """Diagnose each named drill in its own throwaway folder and store."""
    causes = catalogue_causes()
    rows = []
    for name in names:
        with tempfile.TemporaryDirectory(prefix=f"triage-confusion-{name}-") as tmp:
            rows.append(
                run_drill(name, Path(tmp), causes, max_requests, preconditions=preconditions)
            )
            row = rows[-1]
            print(f"{name}: {row.seconds:.0f} s, {row.requests} requests", file=sys.stderr)
    return rows


def _drill_names(value: str | None) -> list[str]:
    known = list_drills()
    if not value:
        return known
    names = [n.strip() for n in value.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown or not names:
        raise SystemExit(
            f"Error: --drills: unknown drill(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(known)}"
        )
    return names


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m triage.drills.confusion",
        description="Diagnose every drill on the real llama-server; print drill x cause.",
    )
    parser.add_argument("--drills", help="comma-separated drill names (default: all)")
    parser.add_argument(
        "--max-requests",
        type=int,
        default=None,
        help=f"replay cap per arm (default {DETERMINISTIC_CAP} for a deterministic failure, "
        f"{INTERMITTENT_CAP} for an intermittent one)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows as JSON to this file")
    parser.add_argument(
        "--no-preconditions",
        action="store_true",
        help="run every planned arm even when the observations show it cannot matter "
        "(to measure what the arm preconditions save)",
    )
    args = parser.parse_args(argv)
    if args.max_requests is not None and not 4 <= args.max_requests <= 1000:
        parser.error("--max-requests must be between 4 and 1000")
    rows = run(
        _drill_names(args.drills), args.max_requests, preconditions=not args.no_preconditions
    )
    print(render(rows, catalogue_causes()))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in rows], indent=2) + "\n")
    return exit_code(rows)


if __name__ == "__main__":
    sys.exit(main())
