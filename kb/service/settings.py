"""What the CLI names or passes on from the knowledge base without opening it: where its
files live, its database URL (redacted for messages), the status vocabularies, the trigger
syntax, the content hash of a captured exchange, an incident file's sidecar paths, and the
bounded file readers (size-capped reads, safe YAML) kb uses for its own files."""

from __future__ import annotations

from kb.models import CAUSE_STATUSES, INCIDENT_STATUSES
from kb.repo.decisions import TRIGGER_SYNTAX, describe_trigger
from kb.repo.engine import data_dir, database_url, redact_url
from kb.repo.fileio import InputTooLarge, load_yaml, read_bounded
from kb.repo.importbatch import IMPORT_BATCH
from kb.repo.sidecar import sidecar_paths
from kb.repo.store import exchange_content_hash

__all__ = [
    "CAUSE_STATUSES",
    "IMPORT_BATCH",
    "INCIDENT_STATUSES",
    "InputTooLarge",
    "TRIGGER_SYNTAX",
    "data_dir",
    "database_url",
    "describe_trigger",
    "exchange_content_hash",
    "load_yaml",
    "read_bounded",
    "redact_url",
    "sidecar_paths",
]
