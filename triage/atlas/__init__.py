"""The atlas from the engine's side: facts from captures, logs, stacks and diagnoses
(`facts`), the matches printed by `triage atlas`, `check`, `diagnose`, the proxy and the UI
(`report`), and the evaluation on held-out cases (`evaluate`). The atlas itself -- entries,
loader, matcher -- is kb.atlas."""

from triage.atlas.facts import (
    facts_from_diagnosis,
    facts_from_exchange,
    facts_from_log,
    facts_from_stack,
    merge_facts,
)
from triage.atlas.report import (
    ATLAS_HEADING,
    atlas_entries,
    format_matches,
    match_exchange,
    match_log_text,
    matches_for_incident,
)

__all__ = [
    "ATLAS_HEADING",
    "atlas_entries",
    "facts_from_diagnosis",
    "facts_from_exchange",
    "facts_from_log",
    "facts_from_stack",
    "format_matches",
    "match_exchange",
    "match_log_text",
    "matches_for_incident",
    "merge_facts",
]
