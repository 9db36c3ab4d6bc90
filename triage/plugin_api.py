"""The plugin API: what a catalogue entry implements, section by section.

This module imports nothing from the project, so a plugin (or a reader) can see the whole
contract in one place. Every entry -- built-in or third-party -- arrives the same way: a
module listed under `[project.entry-points."triage.plugins"]` exposes
`register(catalogue: Registry) -> None` and adds its entries:

    def register(catalogue: Registry) -> None:
        catalogue.causes.add(CAUSE)      # a CauseEntry
        catalogue.arms.add(ARM)          # an ArmEntry
        catalogue.checks.add(CHECK)      # a CheckEntry
        catalogue.formats.add(FORMAT)    # a CaptureFormatEntry
        catalogue.triggers.add(KIND)     # a TriggerKindEntry

Numbers (causes and checks)
---------------------------
A cause or a check declares its stable `number` in its own file, beside its `id`:

    CAUSE = CauseRule(id="prompt-cache", number=21, ...)      # triage/engine/causes/...
    @check("stream-format-violation", number=25)              # triage/checks/...

Nothing else is edited: the knowledge base stores (section, id, number) the first time the
number is used and gives it its family bit; it never needs a list of ids, and no
migration is needed for a new id. The rules:

- A number, once used, belongs to its id for ever: never move or reuse one (a store that
  recorded other numbers refuses the catalogue, naming the id and both numbers).
- Built-in entries (modules under `triage.` / `kb.`) take numbers 0..31; a third-party
  plugin numbers from `PLUGIN_FIRST` (32). Numbers up to `FAMILY_BIT_LAST` (62) get a bit
  in the stored family masks, built-in or not; a higher number is matched by its id's text.
- Adding a built-in cause is one new file in `triage/engine/causes/` plus one line under
  the entry points in pyproject.toml (`.venv/bin/pip install -e .` to see it).

A cause that one probe arm removes can say so declaratively instead of writing a rule:
`removed_by=("spec-off",)` plus a `triage.causes.Removal` -- its texts and, where needed,
the symptom the failing baseline replies must show, a precheck from the stack's facts,
whether this stack can test it, and a check once the arm ran; the shared code in
triage/causes.py gates on the arm and the baseline and decides.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = [
    "BUILTIN_LAST",
    "FAMILY_BIT_LAST",
    "PLUGIN_FIRST",
    "ArmEntry",
    "CaptureFormatEntry",
    "CauseEntry",
    "CheckEntry",
    "Entry",
    "NumberedEntry",
    "Registry",
    "Section",
    "TriggerKindEntry",
]

# Built-in causes and checks number 0..BUILTIN_LAST; a plugin's from PLUGIN_FIRST.
BUILTIN_LAST = 31
PLUGIN_FIRST = 32
# The highest number with a bit in the stored family masks (signed 64-bit integers).
FAMILY_BIT_LAST = 62


@runtime_checkable
class Entry(Protocol):
    """Every entry: a stable string id (files, JSON, the CLI)."""

    @property
    def id(self) -> str: ...


@runtime_checkable
class NumberedEntry(Entry, Protocol):
    """An entry of a numbered section (causes, checks): its stable number, declared in the
    entry's own file."""

    @property
    def number(self) -> int: ...


@runtime_checkable
class CauseEntry(NumberedEntry, Protocol):
    """A cause (`catalogue.causes`; also known as `triage.causes.Cause`); built-ins use
    `triage.causes.CauseRule`.

    - `id`: stable string id (files, JSON, tests); `number`: stable bit position in stored
      family bit sets, declared in the cause's own file (never reuse or move one;
      built-ins 0..BUILTIN_LAST, plugins from PLUGIN_FIRST);
    - `title`, `mechanism`, `decided_by`: text for the diagnosis, UI and retrospective;
    - `retrospective`: how a retrospective words the cause once confirmed ("what happened");
    - `decide(arms, observations)`: the rule. `arms` maps arm names (the baseline is
      "baseline") to `triage.causes.ArmOutcome`; `observations` is a
      `triage.causes.Observations` whose `facts` hold every observation hook's facts by
      name; returns a `triage.causes.Verdict` (`basis="untested"` when this run cannot
      test the cause: such a verdict never overwrites a measured one);
    - optional `when = "crash"`: decided only when the incident's server crashes at startup
      (then every replay is a launch; see `startup-crash`);
    - optional `removed_by = ("arm-id",)`: the arm that removes it (declarative rule).
    """

    @property
    def title(self) -> str: ...

    @property
    def mechanism(self) -> str: ...

    @property
    def decided_by(self) -> str: ...

    @property
    def retrospective(self) -> str: ...

    def decide(self, arms: Mapping[str, Any], observations: Any) -> Any: ...


@runtime_checkable
class ArmEntry(Entry, Protocol):
    """A probe arm (`catalogue.arms`); see `triage.probes.ProbeArm`.

    `level` is "request" or "server"; `order` places it in the plan (built-ins 10-90);
    `plan(stack, request)` returns a `triage.probes.PlannedArm` naming the causes it
    `decides`, or None when the arm does not apply."""

    @property
    def level(self) -> str: ...

    @property
    def order(self) -> int: ...

    # `request`: the request body as on the wire (kb.jsontypes.JsonObject; spelled out
    # here because this module imports nothing from the project).
    def plan(self, stack: Any, request: dict[str, Any]) -> Any: ...


@runtime_checkable
class CheckEntry(NumberedEntry, Protocol):
    """A symptom check (`catalogue.checks`): its id is the finding kind it reports. Make one
    with `triage.symptoms.check(kind, number=N)`."""

    @property
    def user_facing(self) -> bool: ...

    def run(self, view: Any) -> list[Any]: ...


@runtime_checkable
class CaptureFormatEntry(Entry, Protocol):
    """A capture format (`catalogue.formats`); see `triage.capture.formats.CaptureFormat`."""

    @property
    def label(self) -> str: ...

    @property
    def suffixes(self) -> tuple[str, ...]: ...

    @property
    def priority(self) -> int: ...


@runtime_checkable
class TriggerKindEntry(Entry, Protocol):
    """A revisit trigger kind (`catalogue.triggers`); see `kb.triggers.TriggerKind`."""

    @property
    def syntax(self) -> str: ...


E = TypeVar("E", bound=Entry)


class Section(Protocol[E]):
    """One section of the catalogue as a plugin sees it."""

    def add(self, entry: E) -> E: ...

    def ids(self) -> tuple[str, ...]: ...

    def __iter__(self) -> Iterator[E]: ...


class Registry(Protocol):
    """What `register(catalogue)` receives (`triage.catalogue.Catalogue`)."""

    @property
    def causes(self) -> Section[CauseEntry]: ...

    @property
    def arms(self) -> Section[ArmEntry]: ...

    @property
    def checks(self) -> Section[CheckEntry]: ...

    @property
    def formats(self) -> Section[CaptureFormatEntry]: ...

    @property
    def triggers(self) -> Section[TriggerKindEntry]: ...
