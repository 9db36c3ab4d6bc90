"""The one API the CLI, the UI and the proxy use to read and write the knowledge base.

`KnowledgeBase.open(url)` gives the handle; its methods take and return typed records
(`kb.service.records`) and raise `StoreError`s with one line to show (`kb.service.errors`).
`kb.service.live` is the proxy's writer: one transaction per batch of recorded exchanges.
`kb.service.search` (search, failure families), `kb.service.bisect` (bisection records) and
`kb.service.settings` (paths, URLs, vocabularies: nothing that opens the store) serve the CLI.
"""

from kb.service.core import PAGE_SIZE, KnowledgeBase
from kb.service.errors import (
    ConflictError,
    DatabaseError,
    NotFoundError,
    OpenError,
    StoreError,
    database_errors,
)
from kb.service.incidents import SEARCH_LIMIT
from kb.service.records import (
    CellCount,
    DecisionRequest,
    DecisionRow,
    Family,
    IncidentFilters,
    IncidentPage,
    IncidentRow,
    IncidentRuns,
    IncidentTitle,
    LiveIncident,
    LiveOverview,
    RecordedDecision,
    SeriesPoint,
    StatusChange,
    Upstream,
)
from kb.service.settings import (
    CAUSE_STATUSES,
    IMPORT_BATCH,
    INCIDENT_STATUSES,
    TRIGGER_SYNTAX,
    data_dir,
    database_url,
    describe_trigger,
    exchange_content_hash,
    redact_url,
    sidecar_paths,
)

__all__ = [
    "CAUSE_STATUSES",
    "IMPORT_BATCH",
    "INCIDENT_STATUSES",
    "PAGE_SIZE",
    "SEARCH_LIMIT",
    "TRIGGER_SYNTAX",
    "CellCount",
    "ConflictError",
    "DatabaseError",
    "DecisionRequest",
    "DecisionRow",
    "Family",
    "IncidentFilters",
    "IncidentPage",
    "IncidentRow",
    "IncidentRuns",
    "IncidentTitle",
    "KnowledgeBase",
    "LiveIncident",
    "LiveOverview",
    "NotFoundError",
    "OpenError",
    "RecordedDecision",
    "SeriesPoint",
    "StatusChange",
    "StoreError",
    "Upstream",
    "data_dir",
    "database_errors",
    "database_url",
    "describe_trigger",
    "exchange_content_hash",
    "redact_url",
    "sidecar_paths",
]
