"""Search and failure families through the service: full-text search over past incidents,
the past incidents most like a signature, and family links between their causes.

The ranking and the similarity rules live in kb.repo.search and kb.domain.family; this
module gives the CLI one call per question, each one transaction.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass, field

from kb.domain.errors import StoreError
from kb.domain.family import FamilyMatch, Signature
from kb.repo.family import incident_signature, link_family, refresh_signatures, similar_incidents
from kb.repo.search import HIGHLIGHT_END, HIGHLIGHT_START, SearchHit, search
from kb.repo.store import get_incident
from kb.service.core import KnowledgeBase
from kb.vocab import Vocabulary

__all__ = [
    "HIGHLIGHT_END",
    "HIGHLIGHT_START",
    "FamilyLinkMade",
    "FamilyQuery",
    "FamilyResult",
    "LinkRefused",
    "SearchHit",
    "find_family",
    "is_incident",
    "search_incidents",
]


def search_incidents(
    kb: KnowledgeBase,
    text: str,
    *,
    statuses: Collection[str] = (),
    cause: str | None = None,
    limit: int = 20,
) -> list[SearchHit]:
    """Incidents matching `text`, best first (kb.repo.search's rules); `statuses` keeps
    incidents in any of them, `cause` those with that cause not rejected."""
    with kb.transaction(readonly=True) as session:
        return search(session, text, status=list(statuses) or None, cause=cause, limit=limit)


def is_incident(kb: KnowledgeBase, slug: str, vocabulary: Vocabulary | None = None) -> bool:
    """Whether `slug` is a stored incident. Refreshes the stale family signatures first
    (`vocabulary`: the catalogue's numbers): matching stays correct without it, but a
    refresh makes it one scan."""
    with kb.transaction() as session:
        incident = get_incident(session, slug)
        refresh_signatures(session, vocabulary=vocabulary)
    return incident is not None


@dataclass(frozen=True)
class FamilyQuery:
    """What to compare: `signature`, widening the stored signature of `incident` when one is
    named (its kinds and causes added, its known stack fields replacing the incident's)."""

    signature: Signature
    incident: str | None = None
    limit: int = 10
    min_score: float = 0.1
    link: bool = False  # record a family link per confirmed cause shared with a match
    note: str = ""  # stored on those links (default: the similarity)


@dataclass(frozen=True)
class FamilyLinkMade:
    """A family link just recorded: a cause of one incident and the same cause of another."""

    from_slug: str
    cause: str
    to_slug: str
    other_cause: str

    def to_json(self) -> dict[str, str]:
        return {
            "from": self.from_slug,
            "cause": self.cause,
            "to": self.to_slug,
            "other_cause": self.other_cause,
        }


@dataclass(frozen=True)
class LinkRefused:
    """A match that was not linked, and the store's reason."""

    slug: str
    reason: str


@dataclass(frozen=True)
class FamilyResult:
    """The signature compared, the matches (best first) and the links made."""

    query: Signature
    matches: list[FamilyMatch]
    links: list[FamilyLinkMade] = field(default_factory=list)
    refused: list[LinkRefused] = field(default_factory=list)


def _widened(base: Signature, extra: Signature) -> Signature:
    known = {name: value for name, value in extra.fingerprint().items() if value}
    return Signature(
        kinds=base.kinds | extra.kinds,
        causes=base.causes | extra.causes,
        **{**base.fingerprint(), **known},
    )


def find_family(kb: KnowledgeBase, query: FamilyQuery) -> FamilyResult:
    """Past incidents similar to the query (the incident itself left out), and with
    `query.link` the family links to them, all in one transaction."""
    if query.link and query.incident is None:
        raise StoreError("a family link needs an incident (a capture has no causes yet)")
    with kb.transaction(readonly=not query.link) as session:
        signature = query.signature
        if query.incident is not None:
            signature = _widened(incident_signature(session, query.incident), signature)
        matches = similar_incidents(
            session,
            signature,
            query.limit,
            exclude_slug=query.incident,
            min_score=query.min_score,
        )
        result = FamilyResult(signature, matches)
        if query.link and query.incident is not None:
            for match in matches:
                if match.linked:
                    continue
                for cause in sorted(signature.causes & set(match.confirmed_causes)):
                    note = query.note or (
                        f"same failure family (triage family, similarity {match.score:.2f})"
                    )
                    try:
                        link_family(session, query.incident, cause, match.slug, cause, note)
                    except StoreError as exc:
                        result.refused.append(LinkRefused(match.slug, str(exc)))
                        continue
                    result.links.append(FamilyLinkMade(query.incident, cause, match.slug, cause))
    return result
