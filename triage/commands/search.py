"""`triage search` (full-text, ranked, with snippets) and `triage family` (past incidents
with the same signature; `--link` records them as the same failure family)."""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypedDict

import click

from kb.domain.family import FamilyMatch, Signature, signature, stack_fingerprint
from kb.jsontypes import JsonObject
from kb.service import INCIDENT_STATUSES, KnowledgeBase
from kb.service.search import (
    HIGHLIGHT_END,
    HIGHLIGHT_START,
    FamilyQuery,
    FamilyResult,
    SearchHit,
    find_family,
    is_incident,
    search_incidents,
)
from triage.capture import CaptureError, Exchange, load_file
from triage.catalogue import catalogue
from triage.catalogue.numbering import vocabulary
from triage.commands import echo_json, open_kb
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
    with open_kb(ctx) as kb:
        hits = search_incidents(kb, text, statuses=statuses, cause=cause, limit=limit)
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


class StackFacts(TypedDict, total=False):
    """What is known of the stack that answered: from stack.toml (args, model, binary) and
    from the replies themselves (model, build, speculative decoding, thinking default); the
    keys kb.domain.family.stack_fingerprint reads."""

    args: list[str]
    model: str
    binary: str
    server_build: str
    speculative: bool
    thinking_default: bool


@dataclass(frozen=True)
class FamilyTarget:
    """What `triage family` compared: a stored incident, or a capture file and what it told."""

    name: str
    incident: str | None = None
    exchanges: int = 0
    findings: list[str] = field(default_factory=list)
    stack: StackFacts = field(default_factory=lambda: StackFacts())

    def to_json(self) -> JsonObject:
        if self.incident is not None:
            return {"target": self.name, "incident": self.incident}
        return {
            "target": self.name,
            "exchanges": self.exchanges,
            "findings": self.findings,
            "stack": {key: value for key, value in self.stack.items() if key != "args"},
        }


def _exchange_stack(exchange: Exchange) -> StackFacts:
    """What an exchange itself tells about the stack that answered it (llama-server replies).

    model and `system_fingerprint` (the build) from the response; speculative decoding is
    on when `timings.draft_n` > 0; thinking is on by default when the request did not set
    `chat_template_kwargs.enable_thinking` and the reply carries reasoning.
    """
    request = exchange.request or {}
    response = exchange.response or {}
    stack = StackFacts()
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
        first = choices[0] if isinstance(choices, list) and choices else {}
        message = (first.get("message") or {}) if isinstance(first, dict) else {}
        if isinstance(message, dict) and message.get("reasoning_content"):
            stack["thinking_default"] = True
    return stack


def _stack_file(path: Path) -> StackFacts:
    try:
        stack = load_stack(path)
    except StackError as exc:
        raise click.ClickException(str(exc)) from None
    server = stack.server
    found = StackFacts(args=list(server.args))
    if server.model:
        found["model"] = str(server.model)
    if server.binary:
        found["binary"] = str(server.binary)
    return found


def _capture_signature(
    path: Path, response: Path | None, kinds: set[str], causes: set[str], stack: StackFacts
) -> tuple[Signature, FamilyTarget]:
    """The signature of a capture file: its failed findings and what its replies tell."""
    try:
        exchanges = load_file(path, response=response)
    except CaptureError as exc:
        raise click.ClickException(str(exc)) from None
    found_kinds: set[str] = set()
    for exchange in exchanges:
        found_kinds |= failure_kinds(exchange)
    seen = StackFacts()
    for exchange in reversed(exchanges):  # the first exchange that tells a field wins
        seen.update(_exchange_stack(exchange))
    # stack.toml describes the configuration; the replies say what actually answered.
    merged = StackFacts()
    merged.update(stack)
    merged.update(seen)
    target = FamilyTarget(
        str(path), exchanges=len(exchanges), findings=sorted(found_kinds), stack=merged
    )
    return signature(found_kinds | kinds, causes, merged), target


def _print_matches(target: FamilyTarget, query: Signature, matches: list[FamilyMatch]) -> None:
    known = ", ".join(f"{k}={v}" for k, v in query.fingerprint().items() if v) or "unknown"
    click.echo(f"signature of {target.name}:")
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
    with open_kb(ctx) as kb:
        incident = _check_target(kb, target, link)
        stack = _stack_file(stack_path) if stack_path else StackFacts()
        if incident:
            extra = Signature(
                kinds=frozenset(extra_kinds), causes=frozenset(causes), **stack_fingerprint(stack)
            )
            query, found = FamilyQuery(extra, incident=target), FamilyTarget(target, target)
        else:
            sig, found = _capture_signature(Path(target), response, extra_kinds, set(causes), stack)
            query = FamilyQuery(sig)
        query = dataclasses.replace(query, limit=limit, min_score=min_score, link=link, note=note)
        result = find_family(kb, query)
    for refused in result.refused:
        click.echo(f"not linked to {refused.slug}: {refused.reason}", err=True)
    _report_family(found, result, link=link, as_json=as_json)


def _check_target(kb: KnowledgeBase, target: str, link: bool) -> bool:
    """Whether TARGET is a stored incident (else it is a capture file); refreshes signatures."""
    incident = is_incident(kb, target, vocabulary(catalogue()))
    if not incident and not Path(target).is_file():
        raise click.ClickException(f"{target!r} is neither a stored incident nor a file")
    if not incident and link:
        raise click.UsageError("--link needs an incident SLUG (a capture has no causes yet)")
    return incident


def _report_family(found: FamilyTarget, result: FamilyResult, *, link: bool, as_json: bool) -> None:
    """Print the signature, the matches and the links just made (as text or JSON)."""
    query, matches, linked = result.query, result.matches, result.links
    if link:
        # Show the links just made.
        matches = [
            _with_link(match, any(made.to_slug == match.slug for made in linked))
            for match in matches
        ]
    if as_json:
        echo_json(
            {
                **found.to_json(),
                "signature": query.to_dict(),
                "implied_causes": sorted(query.compared_causes() - query.causes),
                "matches": [match.to_dict() for match in matches],
                "links_made": [made.to_json() for made in linked],
            }
        )
        return
    _print_matches(found, query, matches)
    for made in linked:
        click.echo(f"linked {made.from_slug}:{made.cause} <-> {made.to_slug}:{made.other_cause}")
    if link and not linked:
        click.echo("no new family links: no listed match shares a confirmed cause")


def _with_link(match: FamilyMatch, made: bool) -> FamilyMatch:
    if not made or match.linked:
        return match
    return dataclasses.replace(match, linked=True)


def register(group: click.Group) -> None:
    group.add_command(search_command)
    group.add_command(family_command)
