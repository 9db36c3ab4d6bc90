"""`triage capture` (store failing exchanges as evidence) and `triage check` (classify only)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import click

from kb.jsontypes import JsonObject
from kb.service import StoreError, exchange_content_hash
from kb.service.captures import CapturedExchange, attach_orphans, orphans, store_captures
from triage.atlas.report import check_lines, check_matches
from triage.capture import (
    CaptureError,
    Exchange,
    PartialCapture,
    detect_format,
    format_ids,
    read_file,
)
from triage.capture import parse as parse_capture
from triage.capture.common import check_unicode
from triage.catalogue import catalogue
from triage.commands import open_kb
from triage.symptoms import Finding, classify

# Exit status for bad input or a refused write, as every command: `Error: ...` and 1
# (click's own usage errors -- an unknown option, a bad option value -- exit 2).
EXIT_INPUT_ERROR = 1
# `check --fail-on`: a matching finding failed (the input itself was fine).
EXIT_FINDING_FAILED = 3
# Exchanges committed per transaction by `capture` (a HAR of 10,000 exchanges in one
# transaction held SQLite's write lock for minutes).
CAPTURE_BATCH = 200


@dataclass
class Classified:
    """One captured exchange and its findings."""

    exchange: Exchange
    findings: list[Finding]

    @property
    def symptoms(self) -> list[str]:
        return [f.kind for f in self.findings if not f.passed]

    def label(self) -> str:
        where = f" ({self.exchange.location})" if self.exchange.location else ""
        return f"{self.exchange.source_file}#{self.exchange.index}{where}"

    def to_dict(self) -> JsonObject:
        """The exchange and its findings as `check --json` / `capture --json` print them."""
        ex = self.exchange
        return {
            "file": ex.source_file,
            "index": ex.index,
            "location": ex.location,
            "format": ex.source_format,
            "status": ex.status,
            "sha256": ex.sha256,
            "symptoms": self.symptoms,
            "findings": [f.to_dict() for f in self.findings],
        }


class FormatChoice(click.Choice):  # type: ignore[type-arg]
    """`--format`: auto or any format registered in the catalogue (plugins included),
    read when the option is used rather than when the CLI is imported."""

    def __init__(self) -> None:
        super().__init__(("auto",))

    @property
    def choices(self) -> tuple[str, ...]:
        return ("auto", *format_ids())

    @choices.setter
    def choices(self, value: object) -> None:
        pass  # click.Choice.__init__ assigns; the registry is the only source


def _fail(message: str) -> NoReturn:
    raise click.ClickException(message)  # "Error: MESSAGE" on stderr, exit 1


def _kind(data: bytes, path: Path, fmt: str) -> str:
    """The role of one file: a format, or a bare `request` / `response` body."""
    detected = detect_format(data, str(path))
    if fmt == "auto":
        return detected
    if fmt == "pair":
        return detected if detected in ("request", "response") else "pair"
    return fmt


@dataclass
class _Companions:
    """The --request / --response files, each attached to at most one FILE."""

    request: Path | None
    response: Path | None

    def __post_init__(self) -> None:
        self.request_data = read_file(self.request) if self.request is not None else None
        self.response_data = read_file(self.response) if self.response is not None else None
        self.used = {"request": self.request is None, "response": self.response is None}

    def take(self, role: str) -> tuple[bytes | None, str | None]:
        """The unused companion of this role (data, file name), or (None, None)."""
        data = self.request_data if role == "request" else self.response_data
        if data is None or self.used[role]:
            return None, None
        self.used[role] = True
        return data, str(self.request if role == "request" else self.response)

    def check_all_used(self) -> None:
        if not self.used["response"]:
            raise click.UsageError(f"--response {self.response} was not used by any FILE")
        if not self.used["request"]:
            raise click.UsageError(f"--request {self.request} was not used by any FILE")


class _Parser:
    """`parse`, keeping the good records of a partly bad file when asked (--skip-bad)."""

    def __init__(self, skip_bad: bool) -> None:
        self.skip_bad = skip_bad
        self.skipped: list[CaptureError] = []

    def __call__(self, data: bytes, **kwargs: Any) -> list[Exchange]:
        try:
            return parse_capture(data, **kwargs)
        except PartialCapture as exc:
            if not self.skip_bad or not exc.good:
                raise
            self.skipped.extend(
                CaptureError(exc.file, error.location, error.message) for error in exc.errors
            )
            return exc.good


def _parse_one(
    parse: _Parser, path: Path, data: bytes, kind: str, companions: _Companions
) -> list[Exchange]:
    """One FILE that is not a bare request body."""
    if kind in ("response", "sse"):
        attach, attach_name = companions.take("request")
        return parse(
            data,
            format="sse" if kind == "sse" else "pair",
            file=str(path),
            request=attach,
            request_file=attach_name,
        )
    if kind == "curl":
        attach, attach_name = companions.take("response")
        return parse(
            data,
            format="curl",
            file=str(path),
            response=attach,
            response_file=attach_name,
            base_dir=path.parent,
        )
    return parse(data, format=kind, file=str(path), base_dir=path.parent)


def collect(
    files: tuple[Path, ...],
    fmt: str,
    request: Path | None,
    response: Path | None,
    parse: _Parser | None = None,
) -> list[Exchange]:
    """Parse every file (pairing bare request/response bodies); raises CaptureError.
    With a `_Parser(skip_bad=True)`, bad records of JSONL/HAR files are left out and
    listed in its `skipped`."""
    parse = parse or _Parser(skip_bad=False)
    if not files and request is None and response is None:
        raise click.UsageError("give at least one FILE (or --request REQ --response RESP)")
    if not files:
        if request is None or response is None:
            raise click.UsageError("without FILE arguments give both --request and --response")
        return parse(
            read_file(response),
            format="pair",
            file=str(response),
            request=read_file(request),
            request_file=str(request),
        )
    loaded = [(path, read_file(path)) for path in files]
    kinds = [_kind(data, path, fmt) for path, data in loaded]
    companions = _Companions(request, response)
    exchanges: list[Exchange] = []
    i = 0
    while i < len(loaded):
        path, data = loaded[i]
        if kinds[i] != "request":
            exchanges += _parse_one(parse, path, data, kinds[i], companions)
            i += 1
            continue
        # A bare request: its response is the next FILE (two-file pair), else --response.
        if i + 1 < len(loaded) and kinds[i + 1] in ("response", "pair", "sse"):
            next_path, next_data = loaded[i + 1]
            exchanges += parse(
                next_data,
                format="sse" if kinds[i + 1] == "sse" else "pair",
                file=str(next_path),
                request=data,
                request_file=str(path),
            )
            i += 2
            continue
        attach, attach_name = companions.take("response")
        if attach is None:
            raise CaptureError(
                str(path),
                None,
                "this is a request body: give its response as the next FILE or --response",
            )
        exchanges += parse(
            data, format="pair", file=str(path), response=attach, response_file=attach_name
        )
        i += 1
    companions.check_all_used()
    return exchanges


def _gather(
    files: tuple[Path, ...],
    fmt: str,
    request: Path | None,
    response: Path | None,
    skip_bad: bool,
    pick: int | None = None,
) -> list[Exchange]:
    """collect(), with bad input reported as one error line (exit 2), skipped records
    named on stderr, and `--exchange N` applied."""
    parser = _Parser(skip_bad)
    try:
        exchanges = collect(files, fmt, request, response, parser)
    except CaptureError as exc:
        _fail(str(exc))
    for skipped in parser.skipped:
        click.echo(f"warning: skipped {skipped}", err=True)
    if pick is not None:
        if pick > len(exchanges):
            _fail(
                f"--exchange {pick}: the capture holds {len(exchanges)} exchange(s); "
                f"pick one between 1 and {len(exchanges)}"
            )
        exchanges = [exchanges[pick - 1]]
    return exchanges


def _classify_all(exchanges: list[Exchange]) -> list[Classified]:
    return [Classified(ex, classify(ex)) for ex in exchanges]


def _print_human(items: list[Classified], stored: dict[int, str] | None = None) -> None:
    for n, item in enumerate(items):
        ex = item.exchange
        status = f"HTTP {ex.status}" if ex.status else "HTTP ?"
        parts = [item.label(), f"[{ex.source_format}]", status]
        if stored is not None:
            parts.append(f"-> {stored[n]}")
        failed = [f for f in item.findings if not f.passed]
        verdict = ("FAIL: " + ", ".join(item.symptoms)) if failed else "ok: no symptoms"
        click.echo(f"{' '.join(parts)}  {verdict}")
        for finding in failed:
            where = f"  at {finding.where}" if finding.where else ""
            click.echo(f"  x {finding.kind:<27} {finding.reason}{where}")


def _options(func: Any) -> Any:
    func = click.option("--json", "as_json", is_flag=True, help="Print the result as JSON.")(func)
    func = click.option(
        "--exchange",
        "pick",
        type=click.IntRange(min=1),
        metavar="N",
        help="Use only the N-th exchange (from 1, in the order printed) of a capture that "
        "holds several (HAR, JSONL, concatenated SSE streams).",
    )(func)
    func = click.option(
        "--skip-bad",
        is_flag=True,
        help="Keep the good records of a JSONL/HAR file with bad ones (each skipped record "
        "is named on stderr); by default one bad record rejects the file.",
    )(func)
    func = click.option(
        "--response",
        "response",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Response body for a curl FILE or a bare request FILE.",
    )(func)
    func = click.option(
        "--request",
        "request",
        type=click.Path(dir_okay=False, path_type=Path),
        help="Request body for a bare response FILE or an SSE transcript.",
    )(func)
    func = click.option(
        "--format",
        "fmt",
        type=FormatChoice(),
        default="auto",
        show_default=True,
        help="Input format (auto-detected by default).",
    )(func)
    func = click.argument("files", nargs=-1, type=click.Path(path_type=Path))(func)
    return func


def _fail_on_kinds(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> frozenset[str]:
    """`--fail-on`: `any`, or finding kinds the installed checks can report."""
    known = set(catalogue().checks.ids())
    unknown = sorted(set(values) - known - {"any"})
    if unknown:
        raise click.BadParameter(
            f"unknown finding kind {', '.join(map(repr, unknown))}; expected 'any' or one of: "
            f"{', '.join(sorted(known))}",
            ctx=ctx,
            param=param,
        )
    return frozenset(values)


@click.command("check")
@_options
@click.option(
    "--fail-on",
    "fail_on",
    multiple=True,
    metavar="KIND|any",
    callback=_fail_on_kinds,
    help=f"Exit with status {EXIT_FINDING_FAILED} when a finding of this kind fails (any: "
    "any finding); repeatable. For CI: the findings are printed as usual.",
)
def check_command(
    files: tuple[Path, ...],
    fmt: str,
    request: Path | None,
    response: Path | None,
    as_json: bool,
    skip_bad: bool,
    pick: int | None,
    fail_on: frozenset[str],
) -> None:
    """Classify captured exchanges and print their findings (nothing is stored).

    FILE is a JSON request/response pair ({"request":..,"response":..} or a request FILE
    followed by its response FILE), a curl command (with --response or its -i/-N/-v output
    pasted after it) or a curl -v transcript, an SSE transcript, a HAR file, a JSONL log
    (pair or gateway {request:{headers,body},response:{status,body}} records), or any
    format a plugin registers (see --format). Bad input exits with status 1 (`Error: ...`),
    a bad option with 2, a failed `--fail-on` finding with 3.
    """
    items = _classify_all(_gather(files, fmt, request, response, skip_bad, pick))
    atlas, checked, warning = check_matches([(item.exchange, item.findings) for item in items])
    if warning:
        click.echo(f"warning: {warning}", err=True)
    if as_json:
        rows = [
            {**item.to_dict(), "atlas_matches": [m.to_dict() for m in found]}
            for item, found in zip(items, atlas, strict=True)
        ]
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
    else:
        _print_human(items)
        failing = any(item.symptoms for item in items) or any(atlas)
        if not warning and failing:
            click.echo("\n".join(check_lines([i.label() for i in items], atlas, checked)))
    if fail_on and any(
        kind in fail_on or "any" in fail_on for item in items for kind in item.symptoms
    ):
        raise SystemExit(EXIT_FINDING_FAILED)


@click.command("capture")
@_options
@click.option("--incident", "incident_slug", help="Attach the evidence to this incident.")
@click.option(
    "--orphans",
    is_flag=True,
    help="List the evidence stored without --incident (no FILE needed), oldest first.",
)
@click.option(
    "--attach",
    "attach_keys",
    multiple=True,
    metavar="ID|all",
    help="Attach this orphan evidence (an id from --orphans, or all) to --incident; "
    "repeatable. No FILE needed.",
)
@click.option(
    "--batch",
    type=click.IntRange(min=1, max=100_000),
    default=CAPTURE_BATCH,
    show_default=True,
    metavar="N",
    help="Commit the exchanges N at a time (each batch atomic; a capture cut short keeps its "
    "whole batches and running it again stores the rest, never twice).",
)
@click.pass_context
def capture_command(
    ctx: click.Context,
    files: tuple[Path, ...],
    fmt: str,
    request: Path | None,
    response: Path | None,
    as_json: bool,
    skip_bad: bool,
    pick: int | None,
    incident_slug: str | None,
    orphans: bool,
    attach_keys: tuple[str, ...],
    batch: int,
) -> None:
    """Store captured exchanges (redacted, with their findings) as evidence.

    Accepts the same inputs as `triage check`. Every file is read and checked before
    anything is stored: on bad input nothing is stored and the message names the file and
    the line or JSON path. The exchanges are then committed --batch at a time (readers and
    other writers wait for one batch at most); a capture cut short keeps its whole batches.
    An exchange whose content is already stored (on the incident, or among the captures
    attached to none) is not stored again; the output names the evidence it matches, so
    running a cut-short capture again stores the rest.
    Captures stored without --incident are listed by `--orphans` and attached later with
    `--attach ID|all --incident SLUG`.
    """
    if orphans or attach_keys:
        if files:
            raise click.UsageError("--orphans and --attach take no FILE")
        if orphans:
            _list_orphans(ctx, as_json)
        else:
            _attach(ctx, attach_keys, incident_slug, as_json)
        return
    if not files:
        raise click.UsageError("give a FILE to capture (or --orphans, --attach)")
    items = _classify_all(_gather(files, fmt, request, response, skip_bad, pick))
    keys, duplicates = _store_items(ctx, items, incident_slug, batch)
    if as_json:
        out = []
        for n, item in enumerate(items):
            data = item.to_dict()
            data["evidence"] = keys[n]
            data["duplicate"] = n in duplicates
            data["incident"] = incident_slug
            out.append(data)
        click.echo(json.dumps(out, indent=2, ensure_ascii=False))
        return
    _print_human(
        items, {n: k + (" (already stored)" if n in duplicates else "") for n, k in keys.items()}
    )
    target = f" on incident {incident_slug}" if incident_slug else ""
    click.echo(f"stored {len(items) - len(duplicates)} exchange(s){target}")
    if duplicates:
        same = ", ".join(sorted({keys[n] for n in duplicates}, key=_key_number))
        click.echo(f"{len(duplicates)} exchange(s) not stored again: same content as {same}")
    if not incident_slug and len(duplicates) < len(items):
        click.echo(
            "not attached to an incident: list with `triage capture --orphans`, attach with "
            "`triage capture --attach ID|all --incident SLUG`"
        )


def _key_number(key: str) -> tuple[int, str]:
    digits = "".join(ch for ch in key if ch.isdigit())
    return (int(digits) if digits else -1, key)


def _store_items(
    ctx: click.Context, items: list[Classified], incident_slug: str | None, batch: int
) -> tuple[dict[int, str], set[int]]:
    """Store each exchange unless its content is already there: (keys by position, the
    positions that were duplicates). Committed `batch` at a time (kb.service.captures)."""
    try:
        captured = [_captured(item) for item in items]  # bad text is named before any write
    except StoreError as exc:
        _fail(str(exc))

    def progress(done: int, total: int) -> None:
        if total > batch:
            click.echo(f"stored {done}/{total} exchange(s) (batch committed)", err=True)

    with open_kb(ctx) as kb:
        stored = store_captures(kb, captured, incident_slug, batch=batch, progress=progress)
    return stored.keys, stored.duplicates


def _captured(item: Classified) -> CapturedExchange:
    """What the knowledge base stores for one captured exchange."""
    ex = item.exchange
    exchange = ex.to_dict()
    kinds = ", ".join(item.symptoms) or "no symptoms"
    return CapturedExchange(
        exchange=exchange,
        findings=[f.to_dict() for f in item.findings],
        symptoms=item.symptoms,
        digest=_content_hash(item, exchange),
        summary=f"captured {ex.source_format} exchange {item.label()}: {kinds}",
        source=f"{ex.source_format}:{ex.source_file}" + (f":{ex.location}" if ex.location else ""),
    )


def _content_hash(item: Classified, exchange: JsonObject) -> str:
    """The exchange's content hash; text that is not valid Unicode (a lone surrogate from
    a format that does not check it) is named by its JSON path instead of a traceback."""
    try:
        return exchange_content_hash(exchange)
    except UnicodeEncodeError:
        try:
            check_unicode(exchange, item.label())
        except CaptureError as exc:
            raise StoreError(str(exc)) from None
        raise StoreError(f"{item.label()}: not valid Unicode") from None


def _list_orphans(ctx: click.Context, as_json: bool) -> None:
    with open_kb(ctx) as kb:
        rows = [
            {
                "evidence": row.key,
                "kind": row.kind,
                "recorded_at": row.recorded_at.isoformat(),
                "source": row.source,
                "summary": row.summary,
            }
            for row in orphans(kb)
        ]
    if as_json:
        click.echo(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        click.echo("no evidence without an incident")
        return
    for row in rows:
        click.echo(f"{row['evidence']:<6} {row['recorded_at'][:16]}  {row['summary']}")
    click.echo(
        f"{len(rows)} piece(s) of evidence attached to no incident; attach with "
        "`triage capture --attach ID|all --incident SLUG`"
    )


def _attach(
    ctx: click.Context, keys: tuple[str, ...], incident_slug: str | None, as_json: bool
) -> None:
    if not incident_slug:
        raise click.UsageError("--attach needs --incident SLUG")
    with open_kb(ctx) as kb:
        results = [
            (item.orphan, item.key, item.duplicate)
            for item in attach_orphans(kb, list(keys), incident_slug)
        ]
    if as_json:
        click.echo(
            json.dumps(
                [
                    {"orphan": old, "evidence": new, "duplicate": dup, "incident": incident_slug}
                    for old, new, dup in results
                ],
                indent=2,
            )
        )
        return
    for old, new, dup in results:
        if dup:
            click.echo(
                f"{old} -> {new}: {incident_slug} already holds this exchange; orphan removed"
            )
        else:
            click.echo(f"{old} -> {new}")
    added = sum(1 for *_, dup in results if not dup)
    click.echo(f"attached {added} piece(s) of evidence to {incident_slug}")


def register(group: click.Group) -> None:
    """Add `capture` and `check` to the CLI group."""
    group.add_command(capture_command)
    group.add_command(check_command)
