"""The one registry of what triage knows: causes, probe arms, symptom checks, capture
formats and revisit trigger kinds.

Every entry, built-in or third-party, arrives the same way: a plugin module listed in the
`triage.plugins` entry-point group exposes `register(catalogue)` and adds its entries with
`catalogue.causes.add(...)`, `catalogue.arms.add(...)`, and so on (simonw/llm's
`register_models` hook, without pluggy: one hook is all we need). The built-ins are
entry points of this distribution, so adding a cause, an arm, a check, a format or a
trigger kind is one module plus one line in pyproject.toml -- and a third-party package
does the same in its own pyproject.

Entries are plain objects with an `id` attribute (a stable string); what each section's
entries implement is in triage/plugin_api.py. Sections whose order is stored (cause ids
and finding kinds are packed into bit sets in the database) also need an explicit
`number`, declared in the entry's own file: built-in plugins number 0..31, others from
`PLUGIN_FIRST` (32); kb records and checks them against the store (numbering.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Generic, TypeVar

from triage.plugin_api import (
    BUILTIN_LAST,
    PLUGIN_FIRST,
    ArmEntry,
    CaptureFormatEntry,
    CauseEntry,
    CheckEntry,
    Entry,
    TriggerKindEntry,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "Catalogue",
    "CatalogueError",
    "Section",
]

ENTRY_POINT_GROUP = "triage.plugins"
# Modules of this distribution: their plugins load first (kb's trigger kinds are built-ins).
BUILTIN_PREFIXES = ("triage.", "kb.")


class CatalogueError(Exception):
    """A plugin or entry that cannot be registered (names the plugin and the entry)."""


T = TypeVar("T", bound=Entry)


class Section(Generic[T]):
    """One kind of entry: an ordered id -> entry mapping that refuses duplicates."""

    def __init__(self, name: str, *, numbered: bool = False) -> None:
        self.name = name
        self.numbered = numbered
        self._entries: dict[str, T] = {}
        self._origin: dict[str, str] = {}
        self._plugin = "<direct>"

    def add(self, entry: T) -> T:
        """Register one entry; a second entry with the same id (or number) is an error."""
        entry_id = getattr(entry, "id", None)
        if not isinstance(entry_id, str) or not entry_id:
            raise CatalogueError(f"{self._plugin}: {self.name} entry {entry!r} has no string id")
        if entry_id in self._entries:
            raise CatalogueError(
                f"{self._plugin}: {self.name} {entry_id!r} is already registered by "
                f"{self._origin[entry_id]}"
            )
        if self.numbered:
            number = getattr(entry, "number", None)
            if not isinstance(number, int) or isinstance(number, bool) or number < 0:
                raise CatalogueError(
                    f"{self._plugin}: {self.name} {entry_id!r} needs a stable non-negative "
                    "integer `number`"
                )
            for other_id, other in self._entries.items():
                if getattr(other, "number") == number:  # noqa: B009 (numbered sections only)
                    raise CatalogueError(
                        f"{self._plugin}: {self.name} {entry_id!r} reuses number {number} of "
                        f"{other_id!r} ({self._origin[other_id]})"
                    )
        self._entries[entry_id] = entry
        self._origin[entry_id] = self._plugin
        return entry

    def __getitem__(self, entry_id: str) -> T:
        try:
            return self._entries[entry_id]
        except KeyError:
            known = ", ".join(self._entries) or "none"
            raise KeyError(f"unknown {self.name} {entry_id!r} (known: {known})") from None

    def get(self, entry_id: str) -> T | None:
        return self._entries.get(entry_id)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._entries

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._entries.values()))

    def __len__(self) -> int:
        return len(self._entries)

    def ids(self) -> tuple[str, ...]:
        return tuple(self._entries)

    def origin(self, entry_id: str) -> str:
        """The plugin (entry-point name) that registered `entry_id`."""
        return self._origin[entry_id]

    def numbers(self) -> dict[str, int]:
        """id -> stable number (numbered sections only)."""
        if not self.numbered:
            raise CatalogueError(f"{self.name} entries are not numbered")
        return {
            entry_id: int(getattr(e, "number"))  # noqa: B009 (numbered sections only)
            for entry_id, e in self._entries.items()
        }


class Catalogue:
    """All sections; `load()` fills a fresh one from the `triage.plugins` entry points."""

    def __init__(self) -> None:
        self.causes: Section[CauseEntry] = Section("cause", numbered=True)
        self.arms: Section[ArmEntry] = Section("probe arm")
        self.checks: Section[CheckEntry] = Section("symptom check", numbered=True)
        self.formats: Section[CaptureFormatEntry] = Section("capture format")
        self.triggers: Section[TriggerKindEntry] = Section("trigger kind")
        self.plugins: list[str] = []

    def _sections(
        self,
    ) -> tuple[
        Section[CauseEntry],
        Section[ArmEntry],
        Section[CheckEntry],
        Section[CaptureFormatEntry],
        Section[TriggerKindEntry],
    ]:
        return (self.causes, self.arms, self.checks, self.formats, self.triggers)

    def register_plugin(
        self,
        name: str,
        register: Callable[[Catalogue], object],
        *,
        builtin: bool | None = None,
    ) -> None:
        """Run one plugin's `register(catalogue)`, attributing its entries to `name`.

        A built-in plugin (`register` defined in a module of this distribution, unless
        `builtin` says otherwise) numbers its causes and checks 0..BUILTIN_LAST; any other
        plugin from PLUGIN_FIRST, so that it never takes a number a future built-in needs."""
        if builtin is None:
            builtin = str(getattr(register, "__module__", "")).startswith(BUILTIN_PREFIXES)
        before = {section.name: set(section.ids()) for section in self._sections()}
        for section in self._sections():
            section._plugin = name
        try:
            register(self)
            self._check_range(name, before, builtin=builtin)
        except CatalogueError:
            raise
        except Exception as exc:  # a broken plugin must name itself, not crash the CLI
            raise CatalogueError(f"plugin {name!r} failed to register: {exc}") from exc
        finally:
            for section in self._sections():
                section._plugin = "<direct>"
        self.plugins.append(name)

    def _check_range(self, name: str, before: dict[str, set[str]], *, builtin: bool) -> None:
        for section in (self.causes, self.checks):
            for entry_id, number in section.numbers().items():
                if entry_id in before[section.name]:
                    continue
                if builtin and number > BUILTIN_LAST:
                    raise CatalogueError(
                        f"{name}: built-in {section.name} {entry_id!r} uses number {number}: "
                        f"built-in numbers are 0..{BUILTIN_LAST}"
                    )
                if not builtin and number < PLUGIN_FIRST:
                    raise CatalogueError(
                        f"{name}: {section.name} {entry_id!r} uses number {number}: numbers "
                        f"below {PLUGIN_FIRST} belong to the built-ins; a plugin numbers from "
                        f"{PLUGIN_FIRST}"
                    )

    @classmethod
    def load(cls, entry_points: list[metadata.EntryPoint] | None = None) -> Catalogue:
        """Build the catalogue: built-in plugins (`triage.*`, `kb.*` modules) first, then the rest
        in name order, so numbering checks and "already registered" errors are stable."""
        catalogue = cls()
        eps = (
            list(metadata.entry_points(group=ENTRY_POINT_GROUP))
            if entry_points is None
            else list(entry_points)
        )
        eps.sort(key=lambda ep: (not ep.value.startswith(BUILTIN_PREFIXES), ep.name))
        seen: set[str] = set()
        for ep in eps:
            if ep.name in seen:  # the same distribution seen twice on sys.path
                continue
            seen.add(ep.name)
            try:
                target = ep.load()
            except Exception as exc:
                raise CatalogueError(
                    f"plugin {ep.name!r} ({ep.value}) cannot be imported: {exc}"
                ) from exc
            register = getattr(target, "register", target)
            if not callable(register):
                raise CatalogueError(f"plugin {ep.name!r} ({ep.value}) has no register()")
            catalogue.register_plugin(ep.name, register)
        return catalogue
