"""speculative-decoding: a draft model / MTP changes which tokens are committed."""

from __future__ import annotations

from triage.causes import CauseRule, Evidence, Removal, Verdict
from triage.plugin_api import Registry

ID = "speculative-decoding"
ARM = "spec-off"


def _not_enabled(ev: Evidence) -> Verdict | None:
    if ev.obs.speculative_enabled:
        return None
    return Verdict(
        ID,
        "rejected",
        "speculative decoding is not enabled in this stack (no --spec-type / -md flags, "
        "no draft tokens in the replies' timings)",
        deciding_probe="stack",
    )


def _divergence(ev: Evidence) -> str:
    d = ev.obs.divergence
    if not d:
        return ""
    return f"; committed streams diverged in {d.get('diverged')}/{d.get('seeds')} fixed seeds" + (
        f" (first at token {min(d['first_positions'])})" if d.get("first_positions") else ""
    )


CAUSE = CauseRule(
    id=ID,
    number=1,
    title="Speculative decoding changes the committed tokens",
    mechanism="a draft model / MTP changes which tokens are committed",
    decided_by="the failure rate of a server without the speculative flags",
    removed_by=(ARM,),
    removal=Removal(
        precheck=_not_enabled,
        available=lambda ev: ARM in ev.obs.planned or not ev.obs.planned,
        missing="speculative decoding is on, but the server runs at a URL and "
        "cannot be relaunched without it",
        hint="give [server] binary/model/args instead of url",
        removes_text="without speculative decoding the failure goes away",
        unchanged_text="the failure rate is unchanged without it",
        note=_divergence,
        rejected_note="; speculative decoding preserves the distribution, so committed token "
        "streams may differ without changing how often the request fails",
        supports=lambda ev: ("spec-divergence",),
    ),
    retrospective="speculative decoding changed which tokens were committed; without it the "
    "request did not fail",
)


def register(catalogue: Registry) -> None:
    catalogue.causes.add(CAUSE)
