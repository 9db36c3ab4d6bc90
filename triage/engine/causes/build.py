"""server-build: a regression in the llama-server build."""

from __future__ import annotations

from triage.causes import CauseRule, Removal
from triage.plugin_api import Registry

CAUSE = CauseRule(
    id="server-build",
    number=3,
    title="The llama-server build",
    mechanism="a regression in the server build (chat parser, sampling, kernels)",
    decided_by="an alternate llama-server binary",
    removed_by=("alt-build",),
    removal=Removal(
        available=lambda ev: ev.obs.has_alt_binary,
        missing="no alternate llama-server binary",
        hint="add [alternates] binary to stack.toml",
        removes_text="the alternate build removes the failure",
        unchanged_text="the alternate build leaves the failure rate unchanged",
    ),
    retrospective="the llama-server build regressed; another build did not fail",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
