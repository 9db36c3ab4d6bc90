"""Full-text search over past incidents: one API over SQLite FTS5 and PostgreSQL tsvector.

Every incident has one search document (table `incidentsearch`, created by migration
0002_search and kept current by triggers, so every writer is covered) with one column per
field group:

    title      incident title
    summary    incident summary and impact
    body       the incident's Markdown body
    symptoms   symptom kinds and descriptions
    causes     cause titles, rationales, ids and statuses
    evidence   evidence summaries
    decisions  decision kinds, rationales, trade-offs and fixes
    stack      model, weights, server build and flags

A query is user text. It is reduced to its words (letters and digits; everything else,
FTS5 or tsquery syntax included, is a separator), so no query can raise a syntax error.
Words are stemmed on both back ends (porter / english), so "thinking" finds "think", and
model family names also match as prefixes, so "qwen" finds "qwen3".
An incident matches when every word occurs somewhere in its document (in any field
groups); if no incident matches every word, the incidents matching any word are returned
instead, ranked, with `partial=True`.

Ranking: among the matching incidents (at most RANK_CANDIDATES, the most recent, when a
query matches more; see there), SQLite bm25 with per-group weights (title 10, summary 5,
symptoms/causes 4, decisions 3, stack 2, body/evidence 1); PostgreSQL ts_rank over a
weighted tsvector (A: title; B: summary, symptoms, causes; C: decisions, stack; D: body,
evidence). Scores are "higher is better" but are only comparable within one result list.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass

from sqlalchemy import BindParameter, bindparam, text
from sqlmodel import Session, select

from kb.domain.family import MODEL_FAMILIES
from kb.jsontypes import JsonObject
from kb.models import INCIDENT_STATUSES, Incident

__all__ = [
    "FIELDS",
    "HIGHLIGHT_END",
    "HIGHLIGHT_START",
    "SearchHit",
    "query_terms",
    "search",
]

# Field groups, in the order used to break ties when picking the field that matched.
FIELDS = ("title", "summary", "symptoms", "causes", "decisions", "stack", "evidence", "body")
# Column order of the FTS5 table (fixed by the migration).
_FTS_COLUMNS = ("title", "stack", "summary", "body", "symptoms", "causes", "evidence", "decisions")
# Length caps of the PostgreSQL tsvector (same as the migration), used for field checks.
_PG_CAPS = {
    "title": 10_000,
    "stack": 10_000,
    "summary": 50_000,
    "symptoms": 50_000,
    "causes": 50_000,
    "decisions": 50_000,
    "body": 200_000,
    "evidence": 200_000,
}

# PostgreSQL weight classes of the document (migration 0002_search), best first, and
# the field groups in each, in FIELDS order.
_PG_CLASSES = {
    "A": ("title",),
    "B": ("summary", "symptoms", "causes"),
    "C": ("decisions", "stack"),
    "D": ("evidence", "body"),
}

HIGHLIGHT_START = "«"
HIGHLIGHT_END = "»"
ELLIPSIS = "…"
SNIPPET_TOKENS = 24
MAX_TERMS = 32
MAX_TERM_LENGTH = 64
MAX_LIMIT = 1000
# Ranking considers at most this many matching incidents, the most recent ones: an
# unselective query ("content after tokens") matches most of a large history, and scoring
# every match would make its cost grow with the history. Below this many matches the
# ranking is exact over all of them.
RANK_CANDIDATES = 500
# "llama" is left out: every llama-server incident says llama-server / llama.cpp, so the
# word matches everything already and its prefix would merge the largest postings.
_PREFIX_FAMILIES = frozenset(MODEL_FAMILIES) - {"llama"}

_WORD = re.compile(r"[^\W_]+")
_HIGHLIGHTED = re.compile(f"{HIGHLIGHT_START}(.*?){HIGHLIGHT_END}", re.S)
_SPACE = re.compile(r"\s+")


@dataclass(frozen=True)
class SearchHit:
    """One incident found by `search`."""

    slug: str
    title: str
    status: str
    score: float
    field: str
    snippet: str
    partial: bool = False

    def to_dict(self) -> JsonObject:
        return asdict(self)


def query_terms(query: str) -> list[str]:
    """The words of a user query, lower-cased, de-duplicated, in order (at most 32)."""
    terms: list[str] = []
    for match in _WORD.finditer(query or ""):
        term = match.group(0).lower()[:MAX_TERM_LENGTH]
        if term not in terms:
            terms.append(term)
        if len(terms) == MAX_TERMS:
            break
    return terms


def _is_prefix(term: str) -> bool:
    """Model family names also match their versioned spellings ("qwen" finds "qwen3").

    Only those: a prefix term makes both back ends merge the postings of every word with
    that prefix before anything else, which for common prefixes costs more than the rest
    of the search together.
    """
    return term in _PREFIX_FAMILIES


def _statuses(status: str | Iterable[str] | None) -> list[str]:
    if status is None:
        return []
    values = [status] if isinstance(status, str) else list(status)
    unknown = [value for value in values if value not in INCIDENT_STATUSES]
    if unknown:
        raise ValueError(f"unknown incident status {unknown} (expected {INCIDENT_STATUSES})")
    return values


def search(
    session: Session,
    query: str,
    *,
    status: str | Iterable[str] | None = None,
    cause: str | None = None,
    limit: int = 20,
) -> list[SearchHit]:
    """Incidents matching `query`, best first, each with the field that matched and a snippet.

    `status` keeps incidents with that status (or any of several); `cause` keeps incidents
    with a cause of that catalogue id or key that is not rejected.
    """
    terms = query_terms(query)
    statuses = _statuses(status)
    limit = max(1, min(int(limit), MAX_LIMIT))
    if not terms:
        return []
    backend = _SQLite() if session.get_bind().dialect.name == "sqlite" else _Postgres()
    ranked = backend.rank(session, terms, statuses, cause, limit, any_term=False)
    partial = False
    if not ranked and len(terms) > 1:
        ranked = backend.rank(session, terms, statuses, cause, limit, any_term=True)
        partial = True
    if not ranked:
        return []
    ids = [incident_id for incident_id, _score in ranked]
    fields = backend.snippets(session, terms, ids, any_term=partial)
    incidents = {
        row[0]: row
        for row in session.exec(
            select(Incident.id, Incident.slug, Incident.title, Incident.status).where(
                Incident.id.in_(ids)  # type: ignore[union-attr]
            )
        ).all()
    }
    hits = []
    for incident_id, score in ranked:
        if incident_id not in incidents:  # deleted between the two statements
            continue
        _id, slug, title, incident_status = incidents[incident_id]
        field, snippet = fields.get(incident_id, ("title", title))
        hits.append(
            SearchHit(
                slug=slug,
                title=title,
                status=incident_status,
                score=round(float(score), 6),
                field=field,
                snippet=snippet,
                partial=partial,
            )
        )
    return hits


def _filters(
    id_column: str, statuses: Sequence[str], cause: str | None, *, correlated: bool = True
) -> tuple[str, dict[str, str | list[str]], list[BindParameter[list[str]]]]:
    """SQL conditions restricting `id_column` (a qualified incident id) by status and cause.

    SQLite gets correlated scalar subqueries, checked per document as the text index yields
    it: as `IN (SELECT ...)` SQLite may drive the search from the (large) filtered incident
    set and run the full-text query once per incident. PostgreSQL plans `IN (SELECT ...)`
    as a hash semi-join, which is what it should do.
    """
    where = ""
    params: dict[str, str | list[str]] = {}
    binds: list[BindParameter[list[str]]] = []
    if statuses:
        if correlated:
            where += f" AND (SELECT i.status FROM incident i WHERE i.id = {id_column}) IN :statuses"
        else:
            where += f" AND {id_column} IN (SELECT id FROM incident WHERE status IN :statuses)"
        params["statuses"] = list(statuses)
        binds.append(bindparam("statuses", expanding=True))
    if cause:
        condition = "(c.catalogue_id = :cause OR c.key = :cause) AND c.status <> 'rejected'"
        if correlated:
            where += (
                f" AND (SELECT count(*) FROM cause c WHERE c.incident_id = {id_column} "
                f"AND {condition}) > 0"
            )
        else:
            where += f" AND {id_column} IN (SELECT c.incident_id FROM cause c WHERE {condition})"
        params["cause"] = cause
    return where, params, binds


def _best_field(counts: dict[str, int]) -> str:
    """The field with the most distinct matched words; ties go to the earlier FIELDS entry."""
    return max(FIELDS, key=lambda field: (counts.get(field, 0), -FIELDS.index(field)))


def _highlighted_words(snippets: dict[str, str]) -> dict[str, int]:
    """How many distinct words each field's snippet highlights."""
    return {
        field: len({word.lower() for word in _HIGHLIGHTED.findall(snippet or "")})
        for field, snippet in snippets.items()
    }


def _clean(snippet: str) -> str:
    return _SPACE.sub(" ", snippet or "").strip()


class _SQLite:
    @staticmethod
    def _match(terms: Sequence[str], any_term: bool) -> str:
        # Every word becomes an FTS5 string ("..."): no operator, column filter or prefix
        # syntax can come from the user. Words are letters/digits only, so no quote inside.
        return (" OR " if any_term else " AND ").join(
            f'"{term}" *' if _is_prefix(term) else f'"{term}"' for term in terms
        )

    def rank(
        self,
        session: Session,
        terms: Sequence[str],
        statuses: Sequence[str],
        cause: str | None,
        limit: int,
        *,
        any_term: bool,
    ) -> list[tuple[int, float]]:
        where, params, binds = _filters("incidentsearch.rowid", statuses, cause)
        match = self._match(terms, any_term)
        connection = session.connection()
        # Walking the matches in rowid order is cheap (no scoring): the RANK_CANDIDATES
        # most recent matches that pass the filters.
        candidates = [
            row[0]
            for row in connection.execute(
                text(
                    "SELECT rowid FROM incidentsearch WHERE incidentsearch MATCH :match"
                    f"{where} ORDER BY rowid DESC LIMIT :candidates"
                ).bindparams(*binds),
                {**params, "match": match, "candidates": RANK_CANDIDATES},
            )
        ]
        if not candidates:
            return []
        # Rank from the oldest candidate on (with filters that window also holds matches
        # the filters drop; a rare filter over a common query makes it wide, and slower).
        capped = len(candidates) == RANK_CANDIDATES
        bound = " AND rowid >= :oldest" if capped or where else ""
        # `ORDER BY rank` lets FTS5 sort by its configured weighted bm25 itself. With
        # filters, the window from the oldest candidate on is ranked unfiltered (the
        # filters inside this statement make SQLite re-run the text query per row) and
        # the candidates are picked from it in rank order.
        statement = text(
            "SELECT rowid, rank FROM incidentsearch WHERE incidentsearch MATCH :match"
            f"{bound} ORDER BY rank" + ("" if where else " LIMIT :limit")
        )
        rows = connection.execute(
            statement, {"match": match, "limit": limit, "oldest": candidates[-1]}
        )
        if where:
            wanted = set(candidates)
            rows = [row for row in rows if row[0] in wanted][:limit]  # type: ignore[assignment]
        # bm25 is negative, lower is better: flip it so that higher is better everywhere.
        return [(int(row[0]), -float(row[1])) for row in rows]

    def snippets(
        self, session: Session, terms: Sequence[str], ids: Sequence[int], *, any_term: bool
    ) -> dict[int, tuple[str, str]]:
        columns = ", ".join(
            f"snippet(incidentsearch, {index}, :start, :end, :ellipsis, :tokens)"
            for index in range(len(_FTS_COLUMNS))
        )
        # Any-term matching for the snippets, so each field shows whichever words it has.
        statement = text(
            f"SELECT rowid, {columns} FROM incidentsearch "
            "WHERE incidentsearch MATCH :match AND rowid IN :ids"
        ).bindparams(bindparam("ids", expanding=True))
        rows = session.connection().execute(
            statement,
            {
                "match": self._match(terms, any_term=True),
                "ids": list(ids),
                "start": HIGHLIGHT_START,
                "end": HIGHLIGHT_END,
                "ellipsis": ELLIPSIS,
                "tokens": SNIPPET_TOKENS,
            },
        )
        result: dict[int, tuple[str, str]] = {}
        for row in rows:
            snippets = dict(zip(_FTS_COLUMNS, row[1:], strict=True))
            field = _best_field(_highlighted_words(snippets))
            result[int(row[0])] = (field, _clean(snippets[field]))
        return result


class _Postgres:
    @staticmethod
    def _term(index: int, term: str) -> tuple[str, dict[str, str]]:
        """One word as a tsquery: a quoted prefix lexeme ('word':*) or plain text."""
        if _is_prefix(term):
            # Inside quotes the word is plain text to the tsquery parser; it has no quote.
            return f"to_tsquery('english', :t{index})", {f"t{index}": f"'{term}':*"}
        return f"plainto_tsquery('english', :t{index})", {f"t{index}": term}

    @classmethod
    def _tsquery(cls, terms: Sequence[str], any_term: bool) -> tuple[str, dict[str, str]]:
        # One tsquery per word, combined with the tsquery operators && / ||.
        parts: list[str] = []
        params: dict[str, str] = {}
        for index, term in enumerate(terms):
            sql, values = cls._term(index, term)
            parts.append(sql)
            params.update(values)
        return "(" + (" || " if any_term else " && ").join(parts) + ")", params

    def rank(
        self,
        session: Session,
        terms: Sequence[str],
        statuses: Sequence[str],
        cause: str | None,
        limit: int,
        *,
        any_term: bool,
    ) -> list[tuple[int, float]]:
        tsquery, params = self._tsquery(terms, any_term)
        where, filter_params, binds = _filters("s.incident_id", statuses, cause, correlated=False)
        connection = session.connection()
        all_params = {**params, **filter_params}
        # Only stop words ("after when"): an empty tsquery matches nothing, and would make
        # PostgreSQL test every document to find that out.
        if not connection.execute(text(f"SELECT numnode({tsquery})"), params).scalar():
            return []
        # The RANK_CANDIDATES most recent matches, then ts_rank over those only.
        # Normalisation 1 divides by 1 + log(document length): long bodies don't win by size.
        statement = text(
            "SELECT c.incident_id, ts_rank(c.document, "
            f"{tsquery}, 1) AS score FROM (SELECT s.incident_id, s.document "
            f"FROM incidentsearch s WHERE s.document @@ {tsquery}{where} "
            "ORDER BY s.incident_id DESC LIMIT :candidates) c "
            "ORDER BY score DESC, c.incident_id DESC LIMIT :limit"
        ).bindparams(*binds)
        rows = connection.execute(
            statement, {**all_params, "limit": limit, "candidates": RANK_CANDIDATES}
        ).all()
        return [(int(row[0]), float(row[1])) for row in rows]

    def snippets(
        self, session: Session, terms: Sequence[str], ids: Sequence[int], *, any_term: bool
    ) -> dict[int, tuple[str, str]]:
        del any_term  # each field shows whichever words it has
        connection = session.connection()
        term_sql = [self._term(index, term) for index, term in enumerate(terms)]
        term_params = {k: v for _sql, values in term_sql for k, v in values.items()}
        # 1. Which weight class holds the most query words, from the stored document
        # (ts_filter keeps one class's lexemes; nothing is re-parsed).
        counts = ", ".join(
            "("
            + " + ".join(
                f"(ts_filter(s.document, '{{{label.lower()}}}') @@ {sql})::int"
                for sql, _ in term_sql
            )
            + f") AS {label}"
            for label in _PG_CLASSES
        )
        statement = text(
            f"SELECT s.incident_id, {counts} FROM incidentsearch s WHERE s.incident_id IN :ids"
        ).bindparams(bindparam("ids", expanding=True))
        best_class: dict[int, str] = {}
        for row in connection.execute(statement, {**term_params, "ids": list(ids)}):
            by_class = dict(zip(_PG_CLASSES, row[1:], strict=True))
            labels = list(_PG_CLASSES)
            best_class[int(row[0])] = max(
                labels, key=lambda label: (by_class[label], -labels.index(label))
            )
        # 2. A headline of each field of that class (ts_headline parses only that text);
        # the field whose headline highlights the most distinct words is the one shown.
        tsquery, params = self._tsquery(terms, any_term=True)
        options = (
            f"StartSel={HIGHLIGHT_START}, StopSel={HIGHLIGHT_END}, MaxWords={SNIPPET_TOKENS}, "
            f'MinWords=8, MaxFragments=2, FragmentDelimiter=" {ELLIPSIS} "'
        )
        result: dict[int, tuple[str, str]] = {}
        for label, fields in _PG_CLASSES.items():
            members = [i for i, c in best_class.items() if c == label]
            if not members:
                continue
            headlines = ", ".join(
                f"ts_headline('english', left(s.{field}, {_PG_CAPS[field]}), {tsquery}, :options)"
                for field in fields
            )
            statement = text(
                f"SELECT s.incident_id, {headlines} FROM incidentsearch s "
                "WHERE s.incident_id IN :ids"
            ).bindparams(bindparam("ids", expanding=True))
            rows = connection.execute(statement, {**params, "options": options, "ids": members})
            for row in rows:
                snippets = dict(zip(fields, row[1:], strict=True))
                field = _best_field(_highlighted_words(snippets))
                result[int(row[0])] = (field, _clean(snippets[field]))
        return result
