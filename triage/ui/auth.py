"""Who may use the web UI, and which stacks its New-triage form may run.

`triage ui` resolves the settings (command line, `ui.toml`, environment) once, refuses a
non-loopback address without authentication, and hands them to the Streamlit process in
`TRIAGE_UI_*` environment variables; the app reads them back with `UiSettings.from_env`.

Authentication is one of:

- `oidc`: Streamlit's built-in OpenID Connect login (`st.login`), configured in an `[auth]`
  section of Streamlit's `secrets.toml`;
- `header`: a trusted reverse proxy authenticates users and passes the user name in a
  header (say `X-Forwarded-User`); requests are accepted only from the proxy's addresses
  (loopback by default), so a client cannot set the header itself;
- `none`: loopback only (one user on their own machine).

Stacks: the form offers only stack files an administrator listed (`triage ui --stack FILE`
or `[ui] stacks` in ui.toml); nobody types a binary or server arguments into the page.
"""

from __future__ import annotations

import glob
import ipaddress
import os
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from kb.jsontypes import JsonObject
from kb.repo.engine import data_dir
from kb.repo.fileio import read_bounded

__all__ = [
    "AUTH_MODES",
    "UiConfig",
    "UiConfigError",
    "UiSettings",
    "config_path",
    "is_loopback",
    "load_config",
    "oidc_configured",
    "stack_choices",
]

AUTH_MODES = ("none", "oidc", "header")
ENV_AUTH = "TRIAGE_UI_AUTH"
ENV_HEADER = "TRIAGE_UI_AUTH_HEADER"
ENV_PROXIES = "TRIAGE_UI_TRUSTED_PROXIES"
ENV_STACKS = "TRIAGE_UI_STACKS"
ENV_CONFIG = "TRIAGE_UI_CONFIG"
DEFAULT_PROXIES = ("127.0.0.1", "::1")
MAX_CONFIG_BYTES = 1 << 20
MAX_STACK_BYTES = 1 << 20


class UiConfigError(Exception):
    """A UI setting that cannot be used; the message names the file or option."""


def is_loopback(host: str) -> bool:
    """True for addresses only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


@dataclass(frozen=True)
class UiSettings:
    """The resolved UI settings: authentication mode and the stacks the form offers."""

    auth: str = "none"
    header: str = ""
    trusted_proxies: tuple[str, ...] = DEFAULT_PROXIES
    # Stack files and globs (absolute); globs are expanded on every page run, so a stack
    # file an administrator adds to a configured folder shows up without a restart.
    stacks: tuple[str, ...] = field(default_factory=tuple)

    def to_env(self) -> dict[str, str]:
        return {
            ENV_AUTH: self.auth,
            ENV_HEADER: self.header,
            ENV_PROXIES: ",".join(self.trusted_proxies),
            ENV_STACKS: os.pathsep.join(self.stacks),
        }

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> UiSettings:
        env = os.environ if env is None else env
        auth = env.get(ENV_AUTH, "none") or "none"
        if auth not in AUTH_MODES:
            raise UiConfigError(f"{ENV_AUTH}={auth!r}: expected one of {', '.join(AUTH_MODES)}")
        proxies = tuple(p.strip() for p in env.get(ENV_PROXIES, "").split(",") if p.strip())
        stacks = tuple(p for p in env.get(ENV_STACKS, "").split(os.pathsep) if p)
        return cls(
            auth=auth,
            header=env.get(ENV_HEADER, "").strip(),
            trusted_proxies=proxies or DEFAULT_PROXIES,
            stacks=stacks,
        )

    def proxy_trusted(self, ip: str | None) -> bool:
        """Whether a request from `ip` may carry the user header (None: Streamlit's
        loopback connection)."""
        if ip is None:
            return any(is_loopback(p) for p in self.trusted_proxies)
        try:
            address = ipaddress.ip_address(ip)
        except ValueError:
            return False
        for proxy in self.trusted_proxies:
            try:
                if address in ipaddress.ip_network(proxy, strict=False):
                    return True
            except ValueError:
                continue
        return False


# --------------------------------------------------------------------------- config file


def config_path(env: Mapping[str, str] | None = None) -> Path:
    """`TRIAGE_UI_CONFIG`, else `ui.toml` in the data directory."""
    env = os.environ if env is None else env
    explicit = env.get(ENV_CONFIG)
    return Path(explicit) if explicit else data_dir() / "ui.toml"


def _read_toml(path: Path, limit: int) -> JsonObject:
    """The TOML document as in the file (its values are checked by the caller)."""
    try:
        raw = read_bounded(path, limit)
    except OSError as exc:
        raise UiConfigError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return tomllib.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UiConfigError(f"{path}: not valid TOML: {exc}") from None


@dataclass(frozen=True)
class UiConfig:
    """The `[ui]` table of a config file (ui.toml), checked."""

    stacks: tuple[str, ...] = ()  # absolute paths or globs
    auth_header: str = ""
    trusted_proxies: tuple[str, ...] = ()


def load_config(path: Path, *, required: bool = False) -> UiConfig:
    """The `[ui]` table of a config file: stacks (paths or globs, relative to the file),
    auth_header, trusted_proxies. A missing default file is empty."""
    if not path.exists():
        if required:
            raise UiConfigError(f"{path}: no such file")
        return UiConfig()
    data = _read_toml(path, MAX_CONFIG_BYTES)
    table = data.get("ui", {})
    if not isinstance(table, dict):
        raise UiConfigError(f"{path}: [ui] must be a table")
    unknown = set(table) - {"stacks", "auth_header", "trusted_proxies"}
    if unknown:
        raise UiConfigError(f"{path}: [ui]: unknown key(s) {', '.join(sorted(unknown))}")
    lists: dict[str, tuple[str, ...]] = {}
    for key in ("stacks", "trusted_proxies"):
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise UiConfigError(f"{path}: [ui] {key} must be a list of strings")
        lists[key] = tuple(value)
    header = table.get("auth_header", "")
    if not isinstance(header, str):
        raise UiConfigError(f"{path}: [ui] auth_header must be a string")
    return UiConfig(
        stacks=stack_entries(lists["stacks"], base=path.parent),
        auth_header=header,
        trusted_proxies=lists["trusted_proxies"],
    )


def stack_entries(entries: Iterable[str | Path], base: Path | None = None) -> tuple[str, ...]:
    """Configured stack paths and globs as absolute entries; a plain path must exist."""
    found: list[str] = []
    for entry in entries:
        path = Path(entry).expanduser()
        if not path.is_absolute():
            path = (base or Path.cwd()) / path
        text = str(path)
        if not glob.has_magic(text) and not path.is_file():
            raise UiConfigError(f"stack {text}: no such file")
        if text not in found:
            found.append(text)
    return tuple(found)


def resolve_stacks(entries: Iterable[str]) -> tuple[Path, ...]:
    """The stack files the entries name now: paths as given, globs expanded (sorted);
    each file once."""
    found: list[Path] = []
    for entry in entries:
        matches = sorted(glob.glob(entry)) if glob.has_magic(entry) else [entry]
        for match in matches:
            path = Path(match).resolve()
            if path.is_file() and path not in found:
                found.append(path)
    return tuple(found)


def oidc_configured(secrets_files: Iterable[Path]) -> bool:
    """Whether Streamlit's secrets hold a usable `[auth]` section (OIDC login)."""
    auth: JsonObject = {}  # the [auth] tables as in the secrets files, merged
    for path in secrets_files:
        if path.is_file():
            section = _read_toml(path, MAX_CONFIG_BYTES).get("auth")
            if isinstance(section, dict):
                auth.update(section)
    if not auth.get("redirect_uri") or not auth.get("cookie_secret"):
        return False
    providers = [auth] + [value for value in auth.values() if isinstance(value, dict)]
    return any(
        p.get("client_id") and p.get("client_secret") and p.get("server_metadata_url")
        for p in providers
    )


def default_secrets_files(cwd: Path | None = None) -> list[Path]:
    """Where Streamlit looks for secrets.toml by default (global, then the project's)."""
    return [
        Path.home() / ".streamlit" / "secrets.toml",
        (cwd or Path.cwd()) / ".streamlit" / "secrets.toml",
    ]


# --------------------------------------------------------------------------- stacks


@dataclass(frozen=True)
class StackChoice:
    """One stack the New-triage form offers: its label, file, text and folder."""

    label: str
    path: Path
    text: str

    @property
    def base(self) -> Path:
        return self.path.parent


def stack_choices(settings: UiSettings) -> list[StackChoice]:
    """The configured stack files as they are now, read (bounded); labels are the file
    names (full paths where two share a name)."""
    choices: list[StackChoice] = []
    paths = resolve_stacks(settings.stacks)
    names = [path.name for path in paths]
    for path in paths:
        try:
            text = read_bounded(path, MAX_STACK_BYTES).decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise UiConfigError(f"stack {path}: cannot read: {exc}") from None
        label = path.name if names.count(path.name) == 1 else str(path)
        choices.append(StackChoice(label=label, path=path, text=text))
    return choices
