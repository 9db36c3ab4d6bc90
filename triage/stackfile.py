"""`stack.toml`: how the failing server runs and what to compare it with.

A `binary` may name a llama.cpp build instead of a file: `binary = "b9589"` resolves to that
build in the cache (triage/llama/build.py), built on demand with its progress on stderr.
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Required, TypedDict
from urllib.parse import urlsplit

from jsonschema import Draft202012Validator
from jsonschema.exceptions import best_match

from kb.domain.flags import DRAFT_MODEL_FLAGS, SPEC_PREFIXES, SPEC_SWITCH_FLAGS, SPEC_VALUE_FLAGS
from kb.jsontypes import JsonObject
from triage.llama.build import BuildError, server_binary_for

# Flags that switch speculative decoding on or configure it: `spec-off` strips them. The
# vocabulary lives in kb.domain.flags (kb.repo.family reads it too); the names stay importable
# from here.
# Flags whose value is a file: relative values resolve against the stack file's folder.
PATH_VALUE_FLAGS = {
    "-md",
    "--model-draft",
    "--spec-draft-model",
    "-mm",
    "--mmproj",
    "--lora",
    "--chat-template-file",
    "--grammar-file",
    "--slot-save-path",
}


# `binary = "b9589"`: a build number, resolved to the build cache.
BUILD_REFERENCE = re.compile(r"^b(\d{1,6})$")
BuildLog = Callable[[str], None]


class StackError(Exception):
    """A stack file that cannot be used; the message names the file and the field."""


class ServerDescription(TypedDict):
    """A server config as facts and JSON output name it (`safe_describe` masks its secrets)."""

    binary: str | None
    model: str | None
    args: list[str]
    url: str | None


class GatewayDescription(TypedDict):
    """A gateway config as facts and JSON output name it (the key's variable, never the key)."""

    url: str
    name: str | None
    api_key_env: str | None


@dataclass(frozen=True)
class ServerConfig:
    """One way to launch llama-server (or a running one at `url`)."""

    binary: Path | None = None
    model: Path | None = None
    args: tuple[str, ...] = ()
    url: str | None = None

    def with_args(self, args: list[str] | tuple[str, ...]) -> ServerConfig:
        return replace(self, args=tuple(args))

    def key(self) -> str:
        """Identity of the launch: configurations with the same key share one server."""
        return json.dumps(
            [str(self.binary or ""), str(self.model or ""), list(self.args), self.url or ""]
        )

    def describe(self) -> ServerDescription:
        return {
            "binary": str(self.binary) if self.binary else None,
            "model": str(self.model) if self.model else None,
            "args": list(self.args),
            "url": self.url,
        }


@dataclass(frozen=True)
class GatewayConfig:
    """`[gateway]`: what the client talked to in front of llama-server (LiteLLM, llama-swap,
    nginx...). `[server]` stays the server itself, at the url the gateway forwards to."""

    url: str
    name: str | None = None
    # The environment variable holding the key the gateway demands (LiteLLM's master key):
    # the key itself never goes into the stack file.
    api_key_env: str | None = field(default=None, repr=False)

    def api_key(self) -> str | None:
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def describe(self) -> GatewayDescription:
        return {"url": self.url, "name": self.name, "api_key_env": self.api_key_env}


@dataclass(frozen=True)
class Stack:
    server: ServerConfig
    alternate_model: Path | None = None
    alternate_binary: Path | None = None
    known_good: ServerConfig | None = None
    max_requests: int | None = None
    timeout_s: float | None = None
    seed: int | None = None
    source: str = ""
    raw: JsonObject = field(default_factory=dict)  # the stack file as read
    # (json path, build number) of each `binary = "b<N>"` reference, resolved to the cache.
    build_refs: tuple[tuple[str, int], ...] = ()
    gateway: GatewayConfig | None = None

    @property
    def speculative(self) -> bool:
        return has_spec_flags(self.server.args)


def has_spec_flags(args: tuple[str, ...] | list[str]) -> bool:
    if split_spec_flags(args)[1]:
        # `--spec-type none` alone does not switch speculative decoding on.
        spec_type = _flag_value(args, "--spec-type")
        return not (spec_type == "none" and not _flag_value(args, *sorted(DRAFT_MODEL_FLAGS)))
    return False


def _flag_value(args: tuple[str, ...] | list[str], *names: str) -> str | None:
    for index, arg in enumerate(args):
        for name in names:
            if arg == name and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith(name + "="):
                return arg.split("=", 1)[1]
    return None


def _split_flags(
    args: tuple[str, ...] | list[str], kind: Callable[[str], str | None]
) -> tuple[list[str], list[str]]:
    """(kept, removed): `kind(name)` says "value" (the flag takes the next arg unless written
    `--flag=value`), "switch", or None (keep)."""
    kept: list[str] = []
    removed: list[str] = []
    take_value = False
    for arg in args:
        if take_value:
            removed.append(arg)
            take_value = False
            continue
        what = kind(arg.split("=", 1)[0])
        if what is None:
            kept.append(arg)
            continue
        removed.append(arg)
        take_value = what == "value" and "=" not in arg
    return kept, removed


def _spec_kind(name: str) -> str | None:
    if name in SPEC_VALUE_FLAGS:
        return "value"
    if name in SPEC_SWITCH_FLAGS or name.startswith("--no-spec-"):
        return "switch"
    if name.startswith(SPEC_PREFIXES):
        # An unknown --spec-* flag: assume it takes a value unless written with "=".
        return "value"
    return None


def split_spec_flags(args: tuple[str, ...] | list[str]) -> tuple[list[str], list[str]]:
    """(the other args, the speculative-decoding flags with their values), order kept."""
    return _split_flags(args, _spec_kind)


def strip_spec_flags(args: tuple[str, ...] | list[str]) -> list[str]:
    """The argument list with every speculative-decoding flag (and its value) removed."""
    return split_spec_flags(args)[0]


# KV cache type flags of llama-server (K, V) and the types that are not quantized.
KV_CACHE_FLAGS = {"k": ("-ctk", "--cache-type-k"), "v": ("-ctv", "--cache-type-v")}
UNQUANTIZED_KV_TYPES = frozenset({"f16", "f32", "bf16"})


def kv_cache_types(args: tuple[str, ...] | list[str]) -> dict[str, str]:
    """The K and V cache types the args set (llama-server's default for either is f16)."""
    return {
        part: (_flag_value(args, *names) or "f16").lower() for part, names in KV_CACHE_FLAGS.items()
    }


def kv_cache_quantized(args: tuple[str, ...] | list[str]) -> bool:
    """Do the args quantize the K or the V cache (e.g. `-ctk q4_0`, `-ctv q8_0`)?"""
    return any(t not in UNQUANTIZED_KV_TYPES for t in kv_cache_types(args).values())


def set_flag(args: tuple[str, ...] | list[str], flag: str, value: str, *aliases: str) -> list[str]:
    """Replace (or append) `flag value`, removing any alias spellings of it."""
    names = {flag, *aliases}
    kept, _ = _split_flags(args, lambda name: "value" if name in names else None)
    return [*kept, flag, value]


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    schema = json.loads(
        resources.files("kb").joinpath("schemas/stack.schema.json").read_text("utf-8")
    )
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _resolve(base: Path, value: str | None) -> Path | None:
    if not value:
        return None
    path = Path(value).expanduser()
    return path if path.is_absolute() else (base / path).resolve()


def _resolve_binary(base: Path, value: str | None) -> Path | None:
    # A bare command name (no slash) is looked up later on PATH/the build cache, not here.
    if value and "/" not in value:
        return Path(value)
    return _resolve(base, value)


def _resolve_args(base: Path, args: list[str]) -> tuple[str, ...]:
    out: list[str] = []
    resolve_next = False
    for arg in args:
        if resolve_next:
            out.append(str(_resolve(base, arg)))
            resolve_next = False
            continue
        name, eq, value = arg.partition("=")
        if name in PATH_VALUE_FLAGS:
            if eq:
                out.append(f"{name}={_resolve(base, value)}")
            else:
                out.append(arg)
                resolve_next = True
            continue
        out.append(arg)
    return tuple(out)


def build_reference(value: str | Path | None) -> int | None:
    """9589 for `b9589` (a build in the cache), None for a path or a command name."""
    match = BUILD_REFERENCE.match(str(value)) if value is not None else None
    return int(match.group(1)) if match else None


def _resolve_builds(stack: Stack, source: str, build_missing: bool, log: BuildLog | None) -> Stack:
    """Replace `b<N>` binaries by the cached build's path (building it when allowed)."""
    resolved: dict[int, Path] = {}
    refs: list[tuple[str, int]] = []

    def resolve(path: str, value: Path | None) -> Path | None:
        number = build_reference(value)
        if number is None:
            return value
        refs.append((path, number))
        if number not in resolved:
            try:
                resolved[number] = server_binary_for(
                    number,
                    build=build_missing,
                    log=log or (lambda line: print(line, file=sys.stderr, flush=True)),
                )
            except BuildError as exc:
                raise StackError(f"{source}: {path}: build b{number}: {exc}") from None
        return resolved[number]

    server = replace(stack.server, binary=resolve("$.server.binary", stack.server.binary))
    known = stack.known_good
    if known is not None:
        known = replace(known, binary=resolve("$.known_good.binary", known.binary))
    alternate = resolve("$.alternates.binary", stack.alternate_binary)
    if not refs:
        return stack
    return replace(
        stack, server=server, known_good=known, alternate_binary=alternate, build_refs=tuple(refs)
    )


def parse_stack(
    text: str,
    *,
    base: Path,
    source: str = "<stack>",
    build_missing: bool = True,
    log: BuildLog | None = None,
) -> Stack:
    """Parse and validate stack TOML text; relative paths resolve against `base`, and
    `binary = "b<N>"` to the build cache (built on demand unless `build_missing` is False)."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise StackError(f"{source}: not valid TOML: {exc}") from None
    error = best_match(_validator().iter_errors(data))
    if error is not None:
        raise StackError(f"{source}: {error.json_path}: {error.message}")
    server = data["server"]
    config = ServerConfig(
        binary=_resolve_binary(base, server.get("binary")),
        model=_resolve(base, server.get("model")),
        args=_resolve_args(base, server.get("args", [])),
        url=server.get("url"),
    )
    alternates = data.get("alternates", {})
    known = data.get("known_good")
    known_good = None
    if known is not None:
        known_good = ServerConfig(
            binary=_resolve_binary(base, known.get("binary")) or config.binary,
            model=_resolve(base, known.get("model")) or config.model,
            args=_resolve_args(base, known["args"]) if "args" in known else config.args,
        )
    probes = data.get("probes", {})
    section: GatewaySection | None = data.get("gateway")  # checked by the schema above
    gateway = _gateway(section, config, source)
    stack = Stack(
        server=config,
        alternate_model=_resolve(base, alternates.get("model")),
        alternate_binary=_resolve_binary(base, alternates.get("binary")),
        known_good=known_good,
        max_requests=probes.get("max_requests"),
        timeout_s=probes.get("timeout_s"),
        seed=probes.get("seed"),
        source=source,
        raw=data,
        gateway=gateway,
    )
    stack = _resolve_builds(stack, source, build_missing, log)
    _check_files(stack, source)
    return stack


def _origin(url: str) -> str:
    """scheme://host:port of a URL (the default port spelled out), for comparing two."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.scheme}://{(parts.hostname or '').lower()}:{port}"


class GatewaySection(TypedDict, total=False):
    """The stack file's `[gateway]` table as the schema admits it."""

    url: Required[str]
    name: str
    api_key_env: str


def _gateway(
    section: GatewaySection | None, server: ServerConfig, source: str
) -> GatewayConfig | None:
    """`[gateway]`, checked against `[server]`: the gateway forwards to a running server,
    so the server must be given by its url (a server the engine launches listens on a
    port of its own, which the gateway does not know)."""
    if section is None:
        return None
    url = str(section["url"]).rstrip("/")
    try:
        _origin(url)
    except ValueError as exc:
        raise StackError(f"{source}: $.gateway.url: not a valid URL: {exc}") from None
    if not server.url or server.model is not None:
        raise StackError(
            f"{source}: $.gateway: a gateway forwards to a running server; give that server "
            "as $.server.url (the address the gateway forwards to) and no $.server.model -- "
            "a server the engine launches would listen on a port the gateway does not know"
        )
    if _origin(url) == _origin(server.url):
        raise StackError(
            f"{source}: $.gateway.url: {url} is the server's own address ($.server.url); "
            "[gateway] is what the client talked to in front of it"
        )
    key_env = section.get("api_key_env")
    if key_env and key_env not in os.environ:
        raise StackError(
            f"{source}: $.gateway.api_key_env: the environment variable {key_env} is not set "
            "(it must hold the key the gateway demands)"
        )
    return GatewayConfig(url, section.get("name"), key_env)


def _check_files(stack: Stack, source: str) -> None:
    checks = [
        ("$.server.model", stack.server.model),
        ("$.alternates.model", stack.alternate_model),
        ("$.known_good.model", stack.known_good.model if stack.known_good else None),
    ]
    for path, value in checks:
        problem = None if value is None else not_a_regular_file(value)
        if problem is not None:
            raise StackError(f"{source}: {path}: model file {problem}: {value}")
    for path, value in [
        ("$.server.binary", stack.server.binary),
        ("$.alternates.binary", stack.alternate_binary),
    ]:
        problem = None if value is None or "/" not in str(value) else not_a_regular_file(value)
        if problem is not None:
            raise StackError(f"{source}: {path}: binary {problem}: {value}")


_SPECIAL_FILES = (
    (stat.S_ISCHR, "is a character device, not a regular file"),
    (stat.S_ISBLK, "is a block device, not a regular file"),
    (stat.S_ISFIFO, "is a FIFO (named pipe), not a regular file"),
    (stat.S_ISSOCK, "is a socket, not a regular file"),
    (stat.S_ISDIR, "is a directory, not a regular file"),
)


def not_a_regular_file(path: Path) -> str | None:
    """None for a regular file (after symlinks); else what it is: "not found", "is a
    character device, not a regular file" (`/dev/zero`), "is a FIFO ..." -- `stat` only, so a
    FIFO is never opened (which would block)."""
    try:
        mode = path.stat().st_mode
    except FileNotFoundError:
        return "not found"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or type(exc).__name__})"
    if stat.S_ISREG(mode):
        return None
    for test, text in _SPECIAL_FILES:
        if test(mode):
            return text
    return "is not a regular file"


def load_stack(
    path: Path | str, *, build_missing: bool = True, log: BuildLog | None = None
) -> Stack:
    """Read a stack.toml file (see `parse_stack`)."""
    path = Path(path)
    problem = not_a_regular_file(path)
    if problem is not None and problem != "not found":
        raise StackError(f"{path}: {problem}")  # a FIFO would block the read below
    try:
        text = path.read_text("utf-8")
    except FileNotFoundError:
        raise StackError(f"{path}: no such file") from None
    except UnicodeDecodeError:
        raise StackError(f"{path}: not UTF-8 text") from None
    return parse_stack(
        text, base=path.resolve().parent, source=str(path), build_missing=build_missing, log=log
    )
