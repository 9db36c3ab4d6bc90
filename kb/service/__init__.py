"""The one API the CLI, the UI and the proxy use to read and write the knowledge base.

`KnowledgeBase.open(url)` gives the handle; its methods take and return typed records
(`kb.service.records`) and raise `StoreError`s with one line to show (`kb.service.errors`).
`kb.service.live` is the proxy's writer: one transaction per batch of recorded exchanges.
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

__all__ = [
    "PAGE_SIZE",
    "SEARCH_LIMIT",
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
    "database_errors",
]
