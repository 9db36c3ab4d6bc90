"""Atlas matches stored as an incident's references (url, title, note), so that an incident
the proxy opened shows them wherever references show: the UI's incident page, the exported
incident file, the retrospective."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from sqlmodel import Session, select

from kb.models import Reference

__all__ = ["add_references"]

MAX_REFERENCES = 3


def add_references(
    session: Session, incident_id: int, rows: Iterable[Mapping[str, str]]
) -> list[str]:
    """Add these references to the incident in the caller's transaction (one already there
    with the same url is not added again); returns the urls added."""
    existing = set(
        session.exec(select(Reference.url).where(Reference.incident_id == incident_id)).all()
    )
    added: list[str] = []
    for row in list(rows)[:MAX_REFERENCES]:
        url = str(row.get("url") or "")
        if not url or url in existing:
            continue
        session.add(
            Reference(
                incident_id=incident_id,
                url=url[:2000],
                title=str(row.get("title") or "")[:300],
                note=str(row.get("note") or "")[:2000],
            )
        )
        existing.add(url)
        added.append(url)
    return added
