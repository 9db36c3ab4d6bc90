"""`triage search` (full-text, ranked, with snippets) and `triage family` (past incidents
with the same signature; `--link` records them as the same failure family)."""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import click

from kb.domain.errors import StoreError
from kb.domain.family import FamilyMatch, Signature, signature, stack_fingerprint
from kb.models import INCIDENT_STATUSES
from kb.repo.family import incident_signature, link_family, refresh_signatures, similar_incidents
from kb.repo.search import HIGHLIGHT_END, HIGHLIGHT_START, SearchHit, search
from kb.repo.store import Store, get_incident
from triage.capture import CaptureError, load_file
from triage.catalogue import catalogue
from triage.catalogue.numbering import vocabulary
from triage.commands import echo_json, open_store
from triage.stackfile import StackError, load_stack
from triage.symptoms import failure_kinds

_HIGHLIGHT = re.compile(f"{HIGHLIGHT_START}(.*?){HIGHLIGHT_END}", re.S)


def _bold_highlights(snippet: str) -> str:
    return _HIGHLIGHT.sub(lambda m: click.style(m.group(1), bold=True), snippet)


# ------------------------------------------------------------------ search


@click.command("search")
@click.argument("query", nargs=-1, required=True)
@click.option(
    "--status",
    "statuses",
    multiple=True,
    type=click.Choice(INCIDENT_STATUSES),
    help="Only incidents with this status (repeatable).",
)
@click.option("--cause", help="Only incidents with this cause (catalogue id or key), not rejected.")
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 1000))
@click.option("--json", "as_json", is_flag=True, help="Print the hits as JSON.")
@click.pass_context
def search_command(
    ctx: click.Context,
    query: tuple[str, ...],
    statuses: tuple[str, ...],
    cause: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """Full-text search over past incidents, best first, with the matching text.

    Searches titles, summaries, bodies, symptoms, causes, evidence and decisions. Every
    word must occur in an incident (in any of them); words of 3+ letters also match as
    prefixes. When no incident has every word, incidents with some of them are listed.
    """
    text = " ".join(query)
    with open_store(ctx) as store:
        with store.session(readonly=True) as session:
            hits = search(session, text, status=statuses or None, cause=cause, limit=limit)
    if as_json:
        shown = [
            {**hit.to_dict(), "relevance": relevance(hit.score, hits[0].score)} for hit in hits
        ]
        echo_json({"query": text, "hits": shown})
        return
    _print_hits(text, hits)


def relevance(score: float, best: float) -> float | None:
    """A hit's score as a share of the best hit's (1.0 for the best): raw scores are
    engine-specific (SQLite bm25, PostgreSQL ts_rank) and mean nothing on their own."""
    if best <= 0:
        return None
    return round(max(0.0, score) / best, 6)


def relevance_text(share: float | None) -> str:
    """`relevance 100%`, `relevance 38%`, `relevance <1%` (of the best hit)."""
    if share is None:
        return "relevance -"
    percent = math.floor(share * 100)  # rounded down: only a tie with the best reads 100%
    if share > 0 and percent == 0:
        return "relevance <1%"
    return f"relevance {percent}%"


def _print_hits(text: str, hits: list[SearchHit]) -> None:
    if not hits:
        click.echo(f"no incident matches {text!r}")
        return
    if hits[0].partial:
        click.echo(f"no incident has every word of {text!r}; incidents with some of them:")
    else:
        click.echo(
            f"{len(hits)} incident(s); relevance is each one's score as a share of the best's"
        )
    for rank, hit in enumerate(hits, 1):
        share = relevance_text(relevance(hit.score, hits[0].score))
        click.echo(
            f"{rank:>2}. {click.style(hit.slug, bold=True)}  [{hit.status}]  "
            f"{share}  (matched in {hit.field})"
        )
        click.echo(f"    {hit.title}")
        if hit.snippet and hit.field != "title":
            click.echo(f"    {_bold_highlights(hit.snippet)}")


# ------------------------------------------------------------------ family


def _exchange_stack(exchange: Any) -> dict[str, Any]:
    """What an exchange itself tells about the stack that answered it (llama-server replies).

    model and `system_fingerprint` (the build) from the response; speculative decoding is
    on when `timings.draft_n` > 0; thinking is on by default when the request did not set
    `chat_template_kwargs.enable_thinking` and the reply carries reasoning.
    """
    request = exchange.request or {}
    response = exchange.response or {}
    stack: dict[str, Any] = {}
    if response.get("model"):
        stack["model"] = str(response["model"])
    elif request.get("model"):
        stack["model"] = str(request["model"])
    if response.get("system_fingerprint"):
        stack["server_build"] = str(response["system_fingerprint"])
    timings = response.get("timings")
    if isinstance(timings, dict) and "draft_n" in timings:
        stack["speculative"] = bool(timings.get("draft_n"))
    kwargs = request.get("chat_template_kwargs")
    if not (isinstance(kwargs, dict) and "enable_thinking" in kwargs):
        choices = response.get("choices") or []
        message = (choices[0].get("message") or {}) if choices else {}
        if isinstance(message, dict) and message.get("reasoning_content"):
            stack["thinking_default"] = True
    return stack


def _stack_file(path: Path) -> dict[str, Any]:
    try:
        stack = load_stack(path)
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    server = stack.server
    found: dict[str, Any] = {"args": list(server.args)}
    if server.model:
        found["model"] = str(server.model)
    if server.binary:
        found["binary"] = str(server.binary)
    return found


def _capture_signature(
    path: Path, response: Path | None, kinds: set[str], causes: set[str], stack: dict[str, Any]
) -> tuple[Signature, dict[str, Any]]:
    """The signature of a capture file: its failed findings and what its replies tell."""
    try:
        exchanges = load_file(path, response=response)
    except CaptureError as exc:
        raise click.ClickException(str(exc)) from None
    found_kinds: set[str] = set()
    seen: dict[str, Any] = {}
    for exchange in exchanges:
        found_kinds |= failure_kinds(exchange)
        for key, value in _exchange_stack(exchange).items():
            seen.setdefault(key, value)
    # stack.toml describes the configuration; the replies say what actually answered.
    merged = {**stack, **seen}
    info = {
        "target": str(path),
        "exchanges": len(exchanges),
        "findings": sorted(found_kinds),
        "stack": {k: v for k, v in merged.items() if k != "args"},
    }
    return signature(found_kinds | kinds, causes, merged), info


def _print_matches(info: dict[str, Any], query: Signature, matches: list[FamilyMatch]) -> None:
    known = ", ".join(f"{k}={v}" for k, v in query.fingerprint().items() if v) or "unknown"
    click.echo(f"signature of {info['target']}:")
    click.echo(f"  kinds:  {', '.join(sorted(query.kinds)) or '-'}")
    causes = sorted(query.causes)
    implied = sorted(query.compared_causes() - query.causes)
    click.echo(
        f"  causes: {', '.join(causes) or '-'}"
        + (f" (implied by the findings: {', '.join(implied)})" if implied else "")
    )
    click.echo(f"  stack:  {known}")
    if not matches:
        click.echo("no similar past incident")
        return
    click.echo("similar past incidents:")
    for match in matches:
        linked = "  [linked]" if match.linked else ""
        click.echo(
            f"  {match.score:.2f}  {click.style(match.slug, bold=True)}  [{match.status}]{linked}"
        )
        click.echo(f"        {match.title}")
        shared = []
        if match.shared_kinds:
            shared.append("kinds " + ", ".join(match.shared_kinds))
        if match.shared_causes:
            shared.append("causes " + ", ".join(match.shared_causes))
        if match.shared_stack:
            shared.append("stack " + ", ".join(match.shared_stack))
        click.echo(f"        shares: {'; '.join(shared) or 'nothing but weak overlap'}")


@click.command("family")
@click.argument("target")
@click.option(
    "--kinds",
    default="",
    help="Finding kinds to add, comma-separated (for a capture, or instead of one).",
)
@click.option(
    "--cause",
    "causes",
    multiple=True,
    help="A confirmed cause (catalogue id) to add to the signature (repeatable).",
)
@click.option(
    "--stack",
    "stack_path",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="stack.toml of the failing server (model, flags), for a capture file.",
)
@click.option(
    "--response",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="The response file, when TARGET is a bare request body.",
)
@click.option("--limit", default=10, show_default=True, type=click.IntRange(1, 1000))
@click.option("--min-score", default=0.1, show_default=True, type=click.FloatRange(0, 1))
@click.option(
    "--link",
    is_flag=True,
    help="Record the listed matches as the same failure family as the incident "
    "(a family link per confirmed cause they share).",
)
@click.option("--note", default="", help="Note stored on the links made by --link.")
@click.option("--json", "as_json", is_flag=True, help="Print the signature and matches as JSON.")
@click.pass_context
def family_command(
    ctx: click.Context,
    target: str,
    kinds: str,
    causes: tuple[str, ...],
    stack_path: Path | None,
    response: Path | None,
    limit: int,
    min_score: float,
    link: bool,
    note: str,
    as_json: bool,
) -> None:
    """Past incidents with the same signature as an incident SLUG or a capture file.

    The signature is the failed finding kinds, the confirmed causes and the stack
    fingerprint (model family, server build, speculative decoding, thinking default);
    matches are ranked by a weighted Jaccard similarity (see kb.repo.family). For a capture
    file the findings come from the symptom checks and the stack from the replies
    themselves (model, system_fingerprint, timings) plus --stack.
    """
    extra_kinds = {k.strip() for k in kinds.split(",") if k.strip()}
    with open_store(ctx) as store:
        is_incident = _check_target(store, target, link)
        stack = _stack_file(stack_path) if stack_path else {}
        with store.session(readonly=not link) as session:
            if is_incident:
                query, info = _incident_query(session, target, extra_kinds, set(causes), stack)
            else:
                query, info = _capture_signature(
                    Path(target), response, extra_kinds, set(causes), stack
                )
            exclude = target if is_incident else None
            matches = similar_incidents(
                session, query, limit, exclude_slug=exclude, min_score=min_score
            )
            linked = _link(session, target, query, matches, note) if link and is_incident else []
    _report_family(info, query, matches, linked, link=link, as_json=as_json)


def _check_target(store: Store, target: str, link: bool) -> bool:
    """Whether TARGET is a stored incident (else it is a capture file); refreshes signatures."""
    with store.session() as session:
        incident = get_incident(session, target)
        # Signatures stay correct without this; a refresh makes matching one SQL scan.
        refresh_signatures(session, vocabulary=vocabulary(catalogue()))
    if incident is None and not Path(target).is_file():
        raise click.ClickException(f"{target!r} is neither a stored incident nor a file")
    if incident is None and link:
        raise click.UsageError("--link needs an incident SLUG (a capture has no causes yet)")
    return incident is not None


def _incident_query(
    session: Any, slug: str, kinds: set[str], causes: set[str], stack: dict[str, Any]
) -> tuple[Signature, dict[str, Any]]:
    """The stored signature of an incident, widened by the extra kinds, causes and stack."""
    base = incident_signature(session, slug)
    query = Signature(
        kinds=base.kinds | kinds,
        causes=base.causes | causes,
        **{**base.fingerprint(), **_known(stack_fingerprint(stack))},
    )
    return query, {"target": slug, "incident": slug}


def _report_family(
    info: dict[str, Any],
    query: Signature,
    matches: list[FamilyMatch],
    linked: list[dict[str, str]],
    *,
    link: bool,
    as_json: bool,
) -> None:
    """Print the signature, the matches and the links just made (as text or JSON)."""
    if link:
        # Show the links just made.
        matches = [
            _with_link(match, any(made["to"] == match.slug for made in linked)) for match in matches
        ]
    if as_json:
        echo_json(
            {
                **info,
                "signature": query.to_dict(),
                "implied_causes": sorted(query.compared_causes() - query.causes),
                "matches": [match.to_dict() for match in matches],
                "links_made": linked,
            }
        )
        return
    _print_matches(info, query, matches)
    for made in linked:
        click.echo(f"linked {made['from']}:{made['cause']} <-> {made['to']}:{made['other_cause']}")
    if link and not linked:
        click.echo("no new family links: no listed match shares a confirmed cause")


def _known(fingerprint: dict[str, str]) -> dict[str, str]:
    return {name: value for name, value in fingerprint.items() if value}


def _with_link(match: FamilyMatch, made: bool) -> FamilyMatch:
    if not made or match.linked:
        return match
    data = match.to_dict()
    data["linked"] = True
    return FamilyMatch(**data)


def _link(
    session: Any, slug: str, query: Signature, matches: list[FamilyMatch], note: str
) -> list[dict[str, str]]:
    """A family link for each confirmed cause the incident shares with a match (new ones)."""
    made = []
    for match in matches:
        for cause in sorted(query.causes & set(match.confirmed_causes)):
            if match.linked:
                continue
            text = note or f"same failure family (triage family, similarity {match.score:.2f})"
            try:
                link_family(session, slug, cause, match.slug, cause, text)
            except StoreError as exc:
                click.echo(f"not linked to {match.slug}: {exc}", err=True)
                continue
            made.append({"from": slug, "cause": cause, "to": match.slug, "other_cause": cause})
    return made


def register(group: click.Group) -> None:
    group.add_command(search_command)
    group.add_command(family_command)
