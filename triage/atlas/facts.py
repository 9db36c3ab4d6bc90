"""Facts for the atlas matcher, read from what an on-call engineer has: a capture (through
the capture layer and the symptom checks), a llama-server log, a stack and a diagnosis.

Everything here reads plain values and returns `kb.atlas.Facts`; nothing is stored. A fact
that cannot be read is left unknown, never guessed.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from kb.atlas import Facts
from kb.domain.diagnosis import Finding as FindingRecord
from triage.capture import Exchange, redact_text
from triage.llama.build import ServerBinaryNotFound, find_server_binary
from triage.llama.crash import (
    backtrace_frames,
    crash_symbol,
    error_lines,
    host_cpu_flags,
    parse_cpu_flags,
    system_info_features,
)
from triage.stackfile import Stack
from triage.symptoms import Finding

__all__ = [
    "CLIENT_NAMES",
    "facts_from_diagnosis",
    "facts_from_exchange",
    "facts_from_exchange_dict",
    "failed_kinds",
    "facts_from_log",
    "facts_from_stack",
    "log_build",
    "merge_facts",
    "parse_build",
    "server_flags",
    "stack_build",
    "stack_facts",
]

MAX_TEXT_CHARS = 512 * 1024  # per capture: the strings of its response and error
MAX_STRINGS = 5000
_PROMPT_KEYS = frozenset({"prompt", "messages", "input"})
# Clients an atlas entry may name, as they show up in a User-Agent / X-Title header.
CLIENT_NAMES = (
    "cline",
    "opencode",
    "open-webui",
    "openwebui",
    "litellm",
    "llama-swap",
    "codex",
    "roo-code",
    "continue",
    "aider",
    "ollama",
    "koboldcpp",
)
_BUILD_PATTERNS = (
    re.compile(r"\bbuild(?:_info)?\s*[:=]\s*\"?b?(\d{3,6})\b", re.IGNORECASE),
    re.compile(r"\bversion:\s*(\d{3,6})\s*\(", re.IGNORECASE),
    re.compile(r"\bbuild_number\"?\s*[:=]\s*(\d{3,6})\b"),
)
_FINGERPRINT = re.compile(r"^b(\d{3,6})(?:\b|-)")
_CRASH_MARKERS = (
    "segmentation fault",
    "sigsegv",
    "sigabrt",
    "sigill",
    "illegal instruction",
    "core dumped",
    "ggml_assert",
    "terminate called",
    "fatal error",
    "stack smashing detected",
)
_REQUEST_STATUS = re.compile(r"\b(?:GET|POST|PUT|DELETE)\s+/\S*\s+\S+\s+(\d{3})\b")
_COMMAND_LINE = re.compile(r"(?:llama-server|llama-cli|server)(?:\.exe)?\s+(-.*)$")
_FLAG = re.compile(r"(?<![\S])(--?[A-Za-z][A-Za-z0-9-]*)")
_ARCH = re.compile(r"(?:general\.architecture\s+str\s*=|print_info:\s+arch\s*=)\s*(\S+)")
_MODEL_NAME = re.compile(r"(?:general\.name\s+str\s*=|print_info:\s+general\.name\s*=)\s*(.+)$")
_MODEL_FILE = re.compile(r"([^\s'\"=]+\.gguf)\b", re.IGNORECASE)
_BACKEND_MARKERS = (
    ("cuda", ("ggml_cuda_init", "cuda : archs", "cuda0", "using cuda")),
    ("metal", ("ggml_metal", "metal : ", "using metal")),
    ("vulkan", ("ggml_vulkan", "vulkan0", "vulkan : ")),
    ("rocm", ("rocm", "ggml_hip", "hip : ")),
    ("sycl", ("ggml_sycl", "sycl : ", "sycl0")),
)
MAX_LOG_LINES = 50_000
MAX_SCAN_LINE = 4000
_CACHE_FOLDER = re.compile(r"^b(\d{3,6})$")


def _strings(value: Any, out: list[str], budget: list[int]) -> None:
    """Every string leaf of a JSON value (depth-first), within the character budget."""
    stack = [value]
    while stack and budget[0] > 0 and len(out) < MAX_STRINGS:
        item = stack.pop()
        if isinstance(item, str):
            out.append(item[: budget[0]])
            budget[0] -= len(item)
        elif isinstance(item, Mapping):
            # The prompt echoed back (`__verbose.prompt`) is the user's text, not the
            # server's: a signature quoted in a prompt must not match.
            stack.extend(reversed([v for k, v in item.items() if k not in _PROMPT_KEYS]))
        elif isinstance(item, list | tuple):
            stack.extend(reversed(item))


def _clients(headers: Mapping[str, str]) -> frozenset[str]:
    seen = " ".join(
        str(value).casefold()
        for key, value in headers.items()
        if key.casefold() in ("user-agent", "x-title", "http-referer", "referer")
    )
    found = {name for name in CLIENT_NAMES if name in seen}
    if "openwebui" in found:
        found.discard("openwebui")
        found.add("open-webui")
    return frozenset(found)


def failed_kinds(
    findings: Iterable[Finding | FindingRecord | Mapping[str, Any]],
) -> frozenset[str]:
    """The kinds of the failed findings (a check's findings, a diagnosis's, or their dicts)."""
    kinds = set()
    for finding in findings:
        if isinstance(finding, (Finding, FindingRecord)):
            if not finding.passed:
                kinds.add(finding.kind)
        elif not finding.get("passed", True):
            kinds.add(str(finding.get("kind")))
    return frozenset(kinds)


def facts_from_exchange(
    exchange: Exchange, findings: Iterable[Finding | Mapping[str, Any]]
) -> Facts:
    """Facts of one captured exchange: failed finding kinds, HTTP status, the text of its
    error and reply, the model asked for and answered, the build in `system_fingerprint`,
    and the client named in its headers."""
    return facts_from_exchange_dict(exchange.to_dict(), failed_kinds(findings))


def facts_from_exchange_dict(data: Mapping[str, Any], kinds: Iterable[str]) -> Facts:
    """`facts_from_exchange` for an exchange in its stored JSON form (evidence, the proxy's
    examples) with the finding kinds already known."""
    texts: list[str] = []
    budget = [MAX_TEXT_CHARS]
    _strings(data.get("error"), texts, budget)
    _strings(data.get("response"), texts, budget)
    _strings(data.get("response_text"), texts, budget)
    status = data.get("status")
    statuses = {status} if isinstance(status, int) and 100 <= status <= 599 else set()
    response = data.get("response")
    response = response if isinstance(response, Mapping) else {}
    request = data.get("request")
    request = request if isinstance(request, Mapping) else {}
    error = response.get("error")
    if isinstance(error, Mapping) and isinstance(error.get("code"), int):
        if 100 <= int(error["code"]) <= 599:
            statuses.add(int(error["code"]))
    models = [
        str(value)
        for value in (request.get("model"), response.get("model"))
        if isinstance(value, str) and value.strip()
    ]
    build = None
    notes = []
    fingerprint = response.get("system_fingerprint")
    if isinstance(fingerprint, str):
        match = _FINGERPRINT.match(fingerprint.strip())
        if match:
            build = int(match.group(1))
            notes.append(f"build b{build} from the reply's system_fingerprint")
    if models:
        notes.append(f"model {models[0]}")
    headers = data.get("request_headers")
    return Facts(
        source="capture",
        texts=tuple(texts),
        finding_kinds=frozenset(str(kind) for kind in kinds),
        http_status=frozenset(statuses),
        build=build,
        models=tuple(dict.fromkeys(models)),
        clients=_clients(headers if isinstance(headers, Mapping) else {}),
        notes=tuple(notes),
    )


def log_build(text: str) -> int | None:
    """The build number a log states (`build: 11434 (...)`, `build_info: b11434-...`,
    `version: 11434 (...)`), the first one found."""
    for pattern in _BUILD_PATTERNS:
        match = pattern.search(text)
        if match:
            return int(match.group(1))
    return None


def parse_build(text: str) -> int | None:
    """The build number of a `system_fingerprint` / `build_info` value (`b11434-3f9e2a1c`)
    or of a log line (`build: 11434 (...)`)."""
    match = _FINGERPRINT.match(text.strip())
    return int(match.group(1)) if match else log_build(text)


def server_flags(args: Iterable[str]) -> frozenset[str]:
    """Flag names (`--no-repack`, `-fa`) among server arguments; `--flag=value` counts as
    `--flag`."""
    names = set()
    for arg in args:
        match = _FLAG.match(str(arg))
        if match:
            names.add(match.group(1))
    return frozenset(names)


def _command_flags(lines: Sequence[str]) -> frozenset[str]:
    flags: set[str] = set()
    for line in lines:
        match = _COMMAND_LINE.search(line[:MAX_SCAN_LINE])
        if match:
            flags |= server_flags(_FLAG.findall(match.group(1)))
    return frozenset(flags)


def _models(lines: Sequence[str]) -> list[str]:
    found: list[str] = []
    for line in lines:
        line = line[:MAX_SCAN_LINE]  # bounded: a file-name regex on a huge line is quadratic
        for pattern in (_ARCH, _MODEL_NAME):
            match = pattern.search(line)
            if match:
                found.append(match.group(1).strip()[:200])
        if ".gguf" in line.casefold():
            found += [Path(m).name for m in _MODEL_FILE.findall(line)]
        if len(found) > 20:
            break
    return list(dict.fromkeys(found))


def _backends(text: str) -> frozenset[str]:
    lowered = text.casefold()
    found = {name for name, markers in _BACKEND_MARKERS if any(m in lowered for m in markers)}
    if not found and ("system_info:" in lowered or "cpu model buffer" in lowered):
        found.add("cpu")
    return frozenset(found)


def facts_from_log(text: str) -> Facts:
    """Facts of a llama-server log (head and tail are enough): build, system_info CPU
    features, backtrace symbols, error lines, logged HTTP statuses, the flags of a logged
    command line, the model's name / architecture / file, and whether it crashed."""
    lines = text.splitlines()[:MAX_LOG_LINES]
    features = system_info_features(lines)
    cpu_flags = {name.casefold() for name, value in features.items() if value == "1"}
    cpuinfo = parse_cpu_flags(text)  # a pasted /proc/cpuinfo `flags` line, if any
    cpu_flags |= set(cpuinfo)
    frames = backtrace_frames(lines)
    symbol = crash_symbol(frames)
    lowered = text.casefold()
    kinds = set()
    if frames or any(marker in lowered for marker in _CRASH_MARKERS):
        kinds.add("server-crash")
    statuses = {int(m) for m in _REQUEST_STATUS.findall(text) if int(m) >= 400}
    if statuses:
        kinds.add("http-error")
    build = log_build(text)
    notes = []
    if build is not None:
        notes.append(f"build b{build} from the log")
    if features:
        shown = [
            f"{name} = {features[name]}" for name in ("AMX_INT8", "REPACK") if name in features
        ]
        notes.append("system_info" + (": " + ", ".join(shown) if shown else ""))
    if symbol:
        notes.append(f"backtrace in {symbol}")
    errors = error_lines(lines)
    if errors:  # printed and put in --json: scrubbed like any captured free text
        notes.append(f"first error: {redact_text(errors[0])}")
    models = _models(lines)
    if models:
        notes.append(f"model {models[0]}")
    return Facts(
        source="log",
        texts=(text, "\n".join(frames)),
        finding_kinds=frozenset(kinds),
        http_status=frozenset(statuses),
        build=build,
        models=tuple(models),
        backends=_backends(text),
        cpu_flags=frozenset(cpu_flags),
        cpu_flags_known=bool(features) or bool(cpuinfo),
        server_flags=_command_flags(lines),
        notes=tuple(notes),
    )


def facts_from_stack(
    *,
    build: int | None,
    args: Sequence[str] = (),
    model: str | None = None,
    host_flags: Iterable[str] | None = None,
    source: str = "stack",
) -> Facts:
    """Facts of the stack a diagnosis runs: its build, server flags, model file, and (the
    server runs on this host) the host's CPU flags."""
    notes = [f"build b{build} ({source})"] if build is not None else []
    flags = frozenset(host_flags) if host_flags is not None else frozenset()
    return Facts(
        source=source,
        build=build,
        models=(Path(model).name,) if model else (),
        cpu_flags=frozenset(f.casefold() for f in flags),
        cpu_flags_known=host_flags is not None and bool(flags),
        server_flags=server_flags(args),
        notes=tuple(notes),
    )


def facts_from_diagnosis(diagnosis: Mapping[str, Any]) -> Facts:
    """The measured verdicts (confirmed / rejected causes) and what the probing servers
    logged (crash observations, arms' log tails)."""
    causes = diagnosis.get("causes") or []
    confirmed = frozenset(str(c.get("id")) for c in causes if c.get("status") == "confirmed")
    rejected = frozenset(str(c.get("id")) for c in causes if c.get("status") == "rejected")
    texts: list[str] = []
    budget = [MAX_TEXT_CHARS]
    for arm in diagnosis.get("arms") or []:
        _strings(arm.get("log_tail"), texts, budget)
        _strings(arm.get("error"), texts, budget)
    for observation in diagnosis.get("observations") or []:
        if "crash" in str(observation.get("name", "")) or "hang" in str(
            observation.get("name", "")
        ):
            _strings(observation, texts, budget)
    return Facts(
        source="diagnosis",
        texts=tuple(texts),
        confirmed_causes=confirmed,
        rejected_causes=rejected,
    )


def merge_facts(*parts: Facts) -> Facts:
    """One set of facts from several sources: texts and sets joined; the first known build,
    and the CPU flags of a source that read the whole set win over a partial one."""
    if not parts:
        return Facts(source="none")
    merged = parts[0]
    for part in parts[1:]:
        known = merged.cpu_flags_known or part.cpu_flags_known
        merged = replace(
            merged,
            source=merged.source
            if part.source in merged.source.split("+")
            else f"{merged.source}+{part.source}",
            texts=merged.texts + part.texts,
            finding_kinds=merged.finding_kinds | part.finding_kinds,
            http_status=merged.http_status | part.http_status,
            build=merged.build if merged.build is not None else part.build,
            models=tuple(dict.fromkeys(merged.models + part.models)),
            backends=merged.backends | part.backends,
            cpu_flags=merged.cpu_flags | part.cpu_flags,
            cpu_flags_known=known,
            server_flags=merged.server_flags | part.server_flags,
            clients=merged.clients | part.clients,
            confirmed_causes=merged.confirmed_causes | part.confirmed_causes,
            rejected_causes=merged.rejected_causes | part.rejected_causes,
            notes=merged.notes + part.notes,
        )
    return merged


def stack_build(stack: Stack) -> int | None:
    """The llama.cpp build the stack's server runs, when the stack says it without running
    anything: a `binary = "b<N>"` reference, or a binary in the build cache's `b<N>/` folder
    (the default binary too). None for a running server (`url`) or another binary."""
    for path, number in stack.build_refs:
        if path == "$.server.binary":
            return number
    binary = stack.server.binary
    if binary is None:
        if stack.server.url:
            return None
        try:
            binary = find_server_binary()
        except ServerBinaryNotFound:
            return None
    for part in reversed(Path(binary).parts):
        match = _CACHE_FOLDER.match(part)
        if match:
            return int(match.group(1))
    return None


def stack_facts(stack: Stack) -> Facts:
    """`facts_from_stack` of a stack file: its build, flags, model and (a server launched
    here) this host's CPU flags."""
    local = not stack.server.url
    return facts_from_stack(
        build=stack_build(stack),
        args=stack.server.args,
        model=str(stack.server.model) if stack.server.model else None,
        host_flags=host_cpu_flags() if local else None,
    )
