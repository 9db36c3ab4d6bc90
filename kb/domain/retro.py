"""Retrospectives generated from an incident record (the Markdown; kb.domain.retroformat
has the paste formats and the safe HTML rendering).

Input is the record dict of `kb.repo.files.load_record` (the shape of an incident file's front
matter). One page to paste into a postmortem (issue 17): summary, impact, the client's
error text, a timeline of real changes only, one line per cause with its deciding numbers,
the decision and its way back, and the fix options with their measured cost. Nothing is
written that is not in the record, and every claim in the facts sections ends with the ids
of the evidence it rests on, e.g. `[E6, E7]`, each a link to a one-line entry in the
evidence list at the end; the evidence itself (every replay) stays in the record. Statements
about the record itself (that something is *not* on record, or recorded text that cites no
evidence) are set in italics and cite nothing.

Recorded text is escaped before it goes into the Markdown, so it cannot open links,
tables or headings; the HTML is rendered by markdown-it-py with raw HTML off, and only
http(s), mailto and in-page links survive.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from kb.domain.retrofix import fix_option_lines
from kb.domain.retrotext import (
    _key_sort,
    _value,
    _when,
    cause_rationale,
    cite,
    cited,
    code,
    decisive_keys,
    escape,
    evidence_by_id,
    evidence_index,
    failing_text,
    link_ids,
    link_keys,
    record_arms,
)
from kb.domain.retrotimeline import timeline_lines
from kb.jsontypes import JsonObject

__all__ = [
    "FACT_SECTIONS",
    "OBSERVING_PROBES",
    "basis_pending",
    "retro_markdown",
    "unexplained",
]

# The facts sections: every line in them cites evidence (tests check it).
FACT_SECTIONS = (
    "Summary",
    "Client's error",
    "Timeline",
    "Causes",
    "Decision",
    "Fix options",
    "Same failure family",
)

_CITE_RE = re.compile(r"\[((?:\\.|[A-Za-z0-9.-])+)\]\(#([\w-]+)\)")


# --------------------------------------------------------------------------- record views


# --------------------------------------------------------------------------- sections

_STATUS_ORDER = {"confirmed": 0, "rejected": 1, "suspected": 2}
_EXCERPT = 200  # characters of a client's reply or an evidence summary shown inline


def _excerpt(text: Any, limit: int = _EXCERPT) -> str:
    flat = " ".join(str(text).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def unexplained(record: JsonObject) -> bool:
    """Diagnosed (arm measurements on record), some cause ruled out with evidence -- a run
    moves causes only when the failure reproduced -- and none confirmed."""
    causes = record.get("causes") or []
    if not record_arms(record) or any(c.get("status") == "confirmed" for c in causes):
        return False
    return any(c.get("status") == "rejected" and decisive_keys(c) for c in causes)


def _summary(record: JsonObject) -> list[str]:
    index = evidence_index(record)
    lines: list[str] = []
    symptoms = record.get("symptoms") or []
    if symptoms:
        lines.append(
            "- **Failure:** "
            + " ".join(
                cited(s.get("description"), s.get("evidence") or [], index) for s in symptoms
            )
        )
    if unexplained(record):
        ruled_out = sorted(
            {
                k
                for c in record.get("causes") or []
                if c.get("status") == "rejected"
                for k in decisive_keys(c)
            }
        )
        lines.append(
            "- **UNEXPLAINED:** the failure reproduced in the diagnosis and no cause in the "
            f"catalogue is confirmed: the causes tested were ruled out. {cite(ruled_out)}"
        )
    rate = _live_rate(record)
    if rate:
        lines.append(f"- *Live rate, as counted by the proxy: {rate}.*")
    groups = (
        ("Cause", "confirmed"),
        ("Ruled out", "rejected"),
        ("Did not apply", "not-applicable"),
        ("Still open", "suspected"),
    )
    for label, status in groups:
        causes = [c for c in record.get("causes") or [] if _summary_status(c) == status]
        tested = [c for c in causes if decisive_keys(c)]
        if tested:
            lines.append(
                f"- **{label}:** "
                + " ".join(f"{escape(c.get('title'))}. {cite(decisive_keys(c))}" for c in tested)
            )
        if len(tested) < len(causes):
            names = ", ".join(code(c.get("id")) for c in causes if not decisive_keys(c))
            lines.append(f"- *{label}, with no evidence on record: {names}.*")
    decisions = record.get("decisions") or []
    if decisions:
        last = decisions[-1]
        what = f"{escape(last.get('kind'))} on {_when(last.get('at'))}"
        if last.get("evidence"):
            lines.append(f"- **Decision:** {what}. {cite(last['evidence'])}")
        else:
            lines.append(f"- *Decision: {what}, citing no evidence.*")
    return lines or ["*Nothing is on record yet.*"]


# Probes that observe rather than intervene: a cause they reject is one that did not apply
# to the failing replies (thinking causes for a model that does not think), not one a test
# ruled out; the summary lists them apart (issue 28).
OBSERVING_PROBES = ("baseline", "template-render", "stack")


_NOT_APPLICABLE_WHY = {
    "baseline": "none of the failing baseline replies shows what these causes produce",
    "template-render": "the template render shows they cannot apply to this request",
}


def _summary_status(cause: JsonObject) -> str:
    status = str(cause.get("status"))
    if status == "rejected" and str(cause.get("deciding_probe") or "") in OBSERVING_PROBES:
        return "not-applicable"
    return status


def _live_rate(record: JsonObject) -> str:
    """The live failing count of the record's symptoms (the proxy's latest, with its
    as-of time), worded as on the Live page; "" when the proxy counted none."""
    for symptom in record.get("symptoms") or []:
        observed = symptom.get("observed") or {}
        if isinstance(observed, dict) and "failures" in observed and "n" in observed:
            detection = {
                "rate": observed,
                "as_of": observed.get("as_of"),
                "window_minutes": observed.get("window_minutes"),
            }
            return escape(failing_text(detection))
    return ""


def _impact(record: JsonObject) -> list[str]:
    impact = str(record.get("impact") or "").strip()
    if not impact:
        return ["*No impact is recorded.*"]
    quoted = link_ids(escape(impact), evidence_index(record))
    if quoted != escape(impact):  # it cites evidence ids the record has
        return ["*As recorded:*", "", f"> {quoted}"]
    return ["*As recorded (the record links no evidence to this text):*", "", f"> {quoted}"]


def _client_error(record: JsonObject) -> list[str]:
    """What the client saw: the error text of each captured failing exchange (first three)."""
    lines = []
    for item in record.get("evidence") or []:
        exchange = (item.get("payload") or {}).get("exchange")
        if item.get("kind") != "exchange" or not isinstance(exchange, dict):
            continue
        who = _client_name(item.get("payload") or {}, exchange)
        head = f"{code(who)} got " if who else ""
        lines.append(f"- {head}{_error_text(exchange)} {cite([str(item.get('id'))])}")
        if len(lines) == 3:
            break
    return lines or ["*No captured exchange is on record.*"]


def _client_name(payload: JsonObject, exchange: JsonObject) -> str:
    """The client that sent the exchange: the proxy's record of it, else the request's
    User-Agent header; "" when neither is on record."""
    if payload.get("client"):
        return str(payload["client"])
    headers = exchange.get("request_headers")
    if isinstance(headers, dict):
        for name, value in headers.items():
            if str(name).lower() == "user-agent" and value:
                return str(value)
    return ""


def _error_text(exchange: JsonObject) -> str:
    parts = []
    if exchange.get("status"):
        parts.append(f"HTTP {escape(exchange['status'])}")
    response = exchange.get("response")
    choice: JsonObject = {}
    if isinstance(response, dict):
        choices = response.get("choices")
        if isinstance(choices, list) and choices and isinstance(choices[0], dict):
            choice = choices[0]
    if choice.get("finish_reason"):
        parts.append(f"finish_reason {code(choice['finish_reason'])}")
    error = exchange.get("error")
    if not error and isinstance(response, dict):
        error = response.get("error")
    if isinstance(error, dict):
        error = error.get("message") or error
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    content = message.get("content") if isinstance(message, dict) else None
    if error:
        text = f"error {code(_excerpt(_value(error)))}"
    elif isinstance(content, str) and content.strip():
        text = f"the reply shown ({len(content)} chars) {code(_excerpt(content))}"
    elif isinstance(content, str) or choice:
        text = "the reply's content was empty"
    else:
        text = f"reply {code(_excerpt(exchange.get('response_text') or ''))}"
    return (", ".join(parts) + "; " if parts else "") + text + "."


"""(when, source rank: recorded / capture / cause change / revisit / decision, order, text)."""


def _cause_head(cause: JsonObject) -> str:
    return (
        f"{escape(cause.get('title'))} ({code(cause.get('id'))}), "
        f"{escape(cause.get('status'))}, {escape(cause.get('basis', 'untested'))}"
    )


def _cause_line(head: str, cause: JsonObject, keys: list[str], index: dict[str, str]) -> str:
    return f"- **{head}**: {cited(cause_rationale(cause), link_keys(cause) or keys, index)}"


def _causes(record: JsonObject) -> list[str]:
    """One line per cause: status, basis, and the rationale with its deciding numbers."""
    index = evidence_index(record)
    causes = sorted(
        record.get("causes") or [], key=lambda c: _STATUS_ORDER.get(str(c.get("status")), 3)
    )
    lines, unevidenced = [], []
    # Causes that one observation showed did not apply share one line (the page stays one
    # page as the catalogue grows; each rationale is still in the record and `triage show`).
    not_applicable: dict[tuple[str, tuple[str, ...]], list[JsonObject]] = {}
    for cause in causes:
        head = _cause_head(cause)
        keys = decisive_keys(cause)
        if not keys:  # a statement about the record, in italics: nothing to cite
            probe = cause.get("deciding_probe")
            pending = f"; deciding probe not run: {code(probe)}" if probe else ""
            unevidenced.append((cause, f"- *{head}: no evidence on record{pending}.*"))
            continue
        if _summary_status(cause) == "not-applicable":
            group = (str(cause.get("deciding_probe")), tuple(keys))
            not_applicable.setdefault(group, []).append(cause)
            continue
        lines.append(_cause_line(head, cause, keys, index))
    for (probe, shared), members in not_applicable.items():
        if len(members) == 1:
            (cause,) = members
            lines.append(_cause_line(_cause_head(cause), cause, list(shared), index))
            continue
        names = ", ".join(code(c.get("id")) for c in members)
        lines.append(
            f"- **Did not apply** ({names}), rejected by the {escape(probe)} observation: "
            f"{_NOT_APPLICABLE_WHY.get(probe, 'the observation shows they did not apply')}; "
            f"each rationale is in the record {cite(shared)}"
        )
    if len(unevidenced) > 1:  # one line for all of them: each named with what would decide it
        named = "; ".join(
            f"{code(c.get('id'))} {escape(c.get('status'))}"
            + (
                f" ({'needs' if c.get('status') == 'suspected' else 'by'} "
                f"{code(c.get('deciding_probe'))})"
                if c.get("deciding_probe")
                else ""
            )
            for c, _ in unevidenced
        )
        lines.append(f"- *No evidence on record for {len(unevidenced)} causes: {named}.*")
    else:
        lines += [line for _, line in unevidenced]
    return lines or ["*No causes are on record.*"]


def basis_pending(cause: JsonObject) -> bool:
    """A hypothesis still waiting for its deciding measurement."""
    return cause.get("basis") != "measured" and cause.get("status") == "suspected"


def _triggers(triggers: Sequence[JsonObject]) -> str:
    parts = []
    for trigger in triggers:
        text = escape(trigger.get("kind"))
        extras = [
            f"{escape(k)} {escape(_value(v))}"
            for k, v in trigger.items()
            if k not in ("kind", "note")
        ]
        if extras:
            text += f" ({', '.join(extras)})"
        if trigger.get("note"):
            text += f": {escape(trigger['note'])}"
        parts.append(text)
    return "; ".join(parts)


def _decisions(record: JsonObject) -> list[str]:
    index = evidence_index(record)
    lines: list[str] = []
    for decision in record.get("decisions") or []:
        keys = [str(k) for k in decision.get("evidence") or []]
        by = f" by {escape(decision['by'])}" if decision.get("by") else ""
        head = f"{escape(decision.get('kind'))} on {_when(decision.get('at'))}{by}"
        parts = [("", decision.get("rationale"))]
        if decision.get("tradeoff"):
            parts.append(("Tradeoff", decision["tradeoff"]))
        if decision.get("fix"):
            label = "verified" if decision.get("verified") else "not verified"
            parts.append((f"Fix ({label})", decision["fix"]))
        if keys:
            for label, text in parts:
                prefix = f"- **{head}**: " if not label else f"  - {label}: "
                lines.append(prefix + cited(text, keys, index, narrow=True))
        else:
            # Nothing on record backs it: the decision's own words, as recorded, uncited.
            lines.append(f"- *{head}; the decision cites no evidence.*")
            lines += [
                f"  - *{label or 'Why'}, as recorded: {link_ids(escape(text), index).rstrip('.')}.*"
                for label, text in parts
                if text
            ]
        plan = []
        if decision.get("revisit_on"):
            plan.append(f"revisit on {_when(decision['revisit_on'])}")
        if decision.get("triggers"):
            plan.append(f"or earlier on: {_triggers(decision['triggers']).rstrip('.')}")
        if plan:
            # The plan is what was decided, not a claim about the incident: no citation.
            lines.append(f"  - *Way back, as decided: {'; '.join(plan)}.*")
    return lines or ["*No decision is on record.*"]


def _family(record: JsonObject) -> list[str]:
    index = evidence_index(record)
    causes = {str(c.get("id")): c for c in record.get("causes") or []}
    lines = []
    for link in record.get("family") or []:
        cause = causes.get(str(link.get("cause")), {})
        # The link and its note are one claim: one citation at the end.
        note = f" {link_ids(escape(link['note']), index)}" if link.get("note") else ""
        lines.append(
            f"- Here {code(link.get('cause'))} ({escape(cause.get('status', '?'))}) is in the "
            f"same failure family as {code(link.get('other_cause'))} of incident "
            f"{code(link.get('incident'))}.{note} {cite(decisive_keys(cause))}"
        )
    return lines or ["*No same-family incidents are on record.*"]


def _references(record: JsonObject) -> list[str]:
    sources = {
        str(item.get("id")): str(item.get("source") or "") for item in record.get("evidence") or []
    }
    lines = []
    for reference in record.get("references") or []:
        url = str(reference.get("url") or "")
        title = escape(reference.get("title") or url)
        if url and url.lower().startswith(("http://", "https://")) and " " not in url:
            # The URL goes in <...> so no character in it can end the link early.
            text = f"[{title}](<{url.replace('<', '%3C').replace('>', '%3E')}>)"
        else:
            text = title + (f" ({escape(url)})" if url else "")
        if reference.get("note"):
            text += f": {escape(reference['note'])}"
        keys = [k for k, source in sources.items() if url and url in source]
        if keys:
            text += f" {cite(keys)}"
        lines.append(f"- {text}")
    return lines or ["*No references are on record.*"]


def _appendix(record: JsonObject, body: str, level: int, *, anchors: bool = True) -> list[str]:
    """One short entry per cited id (its anchor, kind, time and summary); the evidence
    itself, every replay included, stays in the record (`triage incidents show`, export).
    Without `anchors`: one list item per id, no headings to link to."""
    evidence = evidence_by_id(record)
    used = {m.group(1).replace("\\", "") for m in _CITE_RE.finditer(body)}
    hashes = "#" * level
    lines: list[str] = []
    for key in sorted(used, key=_key_sort):
        item = evidence.get(key)
        if item is None:
            missing = "*This id is not in the record's evidence.*"
            lines += (
                [f"{hashes} {escape(key)}", "", missing, ""]
                if anchors
                else [f"- **{escape(key)}**: {missing}"]
            )
            continue
        meta = [escape(item.get("kind")), _when(item.get("recorded_at"))]
        if item.get("source"):
            meta.append(escape(_excerpt(item["source"], 80)))
        summary = escape(_excerpt(item.get("summary")))
        if anchors:
            lines += [f"{hashes} {escape(key)}", "", f"*{', '.join(meta)}:* {summary}", ""]
        else:
            lines.append(f"- **{escape(key)}** ({', '.join(meta)}): {summary}")
    if not anchors and lines:
        lines.append("")
    return lines or ["*No evidence is cited.*", ""]


# --------------------------------------------------------------------------- documents


def retro_markdown(record: JsonObject, *, level: int = 1, anchors: bool = True) -> str:
    """The retrospective of one incident record as Markdown (title at heading `level`): one
    page to paste into a postmortem, every claim cited, the evidence linked not inlined.
    Without `anchors`, citations are plain `[E1, E2]` and the evidence a list (no in-page
    links: they break when pasted into Slack or Jira)."""
    top, sub = "#" * level, "#" * (level + 1)
    slug = record.get("slug")
    header = [
        f"{top} Retrospective: {escape(record.get('title', slug or 'incident'))}",
        "",
        f"*Incident {code(slug)}, opened {escape(record.get('opened'))}, status "
        f"{escape(record.get('status'))}. Generated from the record: every claim cites its "
        "evidence, listed at the end; all of it, every replay included, is in the record "
        f"({code('triage incidents show')}, {code('triage export')}).*",
        "",
    ]
    arms = record_arms(record)
    sections = [
        ("Summary", _summary(record)),
        ("Impact", _impact(record)),
        ("Client's error", _client_error(record)),
        ("Timeline", timeline_lines(record)),
        ("Causes", _causes(record)),
        ("Decision", _decisions(record)),
        # Only for diagnosed incidents (arm measurements on record); every line cites.
        *([("Fix options", fix_option_lines(arms, escape, cite))] if arms else []),
        *([("Same failure family", _family(record))] if record.get("family") else []),
        *([("References", _references(record))] if record.get("references") else []),
    ]
    body_lines: list[str] = []
    for title, lines in sections:
        body_lines += [f"{sub} {escape(title)}", "", *lines, ""]
    body = "\n".join(body_lines)
    appendix = [f"{sub} Evidence", "", *_appendix(record, body, level + 2, anchors=anchors)]
    text = "\n".join(header) + "\n" + body + "\n" + "\n".join(appendix)
    if not anchors:
        text = _CITE_GROUP_RE.sub(_plain_citation, text)
    return text.rstrip("\n") + "\n"


# --------------------------------------------------------------------------- paste formats

_CITE_GROUP_RE = re.compile(r"\\\[((?:\[(?:\\.|[A-Za-z0-9.-])+\]\(#[\w-]+\)(?:, )?)+)\\\]")


def _plain_citation(match: re.Match[str]) -> str:
    keys = [m.group(1).replace("\\", "") for m in _CITE_RE.finditer(match.group(0))]
    return f"[{', '.join(keys)}]"


# --------------------------------------------------------------------------- HTML
