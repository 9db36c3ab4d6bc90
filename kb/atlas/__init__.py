"""The known-incident atlas: public upstream incidents shipped as data (kb/atlas/entries/),
plus a team's own folders, and a pure matcher from facts about a failure to entries.

kb knows nothing about llama-server: the facts are read in triage/atlas/ and handed here as
plain values (`Facts`).
"""

from kb.atlas.loader import (
    ATLAS_PATH_ENV,
    SHIPPED_DIR,
    AtlasEntry,
    AtlasError,
    BuildRange,
    ImportResult,
    Signatures,
    atlas_dirs,
    import_atlas,
    load_atlas,
    load_entry,
    parse_entry,
    team_dir,
)
from kb.atlas.match import THRESHOLD, TOP, Facts, Match, MatchedFact, family_in, match_atlas

__all__ = [
    "ATLAS_PATH_ENV",
    "SHIPPED_DIR",
    "THRESHOLD",
    "TOP",
    "AtlasEntry",
    "AtlasError",
    "BuildRange",
    "Facts",
    "ImportResult",
    "Match",
    "MatchedFact",
    "Signatures",
    "atlas_dirs",
    "family_in",
    "import_atlas",
    "load_atlas",
    "load_entry",
    "match_atlas",
    "parse_entry",
    "team_dir",
]
