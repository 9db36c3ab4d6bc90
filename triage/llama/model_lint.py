"""Model-file lint (issue 23): what the GGUF metadata and the server's own log say about a
model served for chat, before any replay.

Three findings, each a finding kind of its own (kb/vocab.py):

- `chat-template-missing` (19): the GGUF has no `tokenizer.chat_template` and the server is
  given none (`--chat-template`, `--chat-template-file`): llama-server falls back to
  ChatML, whatever format the model was trained on.
- `base-model-for-chat` (20): a base (pretrained, not instruction-tuned) model answers a
  chat request: it continues the transcript instead of answering and ending its turn.
  Decided from the metadata's own words (general.name / basename / finetune / tags / type:
  "instruct", "-it", "chat", "sft", "dpo"... versus "base", "pretrained", "pt") and, when
  they say nothing, from the chat template: no template and no instruct marker is a base
  model by every sign the file gives.
- `end-of-turn-mismatch` (21): the served format closes the assistant's turn with a marker
  that is not one of the model's end-of-generation tokens -- or not a token of its
  vocabulary at all (ChatML's `<|im_end|>` on a Gemma vocabulary) -- so the model cannot
  end its turn the way the format expects and writes on until a limit stops it.

What the server serves is read from its log at `-lv 4` (the engine's level): the
`example_format` it prints (a conversation rendered with its template, "Hi there" as the
assistant's turn) and its `EOG token` lines. Without a log (a server by URL, a lint before
launch) the same is computed as llama.cpp does: the template from the GGUF (ChatML when it
has none), end-of-generation tokens = eos / eot / eom ids plus the tokens whose text
llama.cpp treats as end of generation.

Measured on the real models (b11434): SmolLM2-135M-Instruct carries a ChatML template whose
`<|im_end|>` is its EOS and an EOG token -- all three pass; Gemma 3 270M base has no
template (the log shows ChatML), no instruct marker, and its EOG tokens are `<eos>`,
`<end_of_turn>`, `</s>` -- `<|im_end|>` is not in its vocabulary: all three fail.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triage.checks.base import Finding
from triage.llama.gguf_kv import GGUFKV, GGUFKVError, read_kv

__all__ = [
    "BASE_KIND",
    "CHATML_EXAMPLE",
    "EOT_KIND",
    "LINT_KINDS",
    "LINT_NEXT",
    "TEMPLATE_KIND",
    "ModelFile",
    "ServerLog",
    "lint",
    "lint_files",
    "lint_findings",
    "model_file",
    "parse_log",
]

TEMPLATE_KIND = "chat-template-missing"
BASE_KIND = "base-model-for-chat"
EOT_KIND = "end-of-turn-mismatch"
LINT_KINDS = (TEMPLATE_KIND, BASE_KIND, EOT_KIND)
# What to try next when a lint finding fails (the UNEXPLAINED verdict's next probes).
LINT_NEXT = {
    TEMPLATE_KIND: "model file: give the server the model's own chat template "
    "(--chat-template-file) or serve a GGUF that carries one",
    BASE_KIND: "model file: serve an instruction-tuned model for chat (a base model "
    "continues text: send it a /completion prompt instead)",
    EOT_KIND: "model file: serve the template the model was trained on, whose end-of-turn "
    "marker is one of its end-of-generation tokens",
}

TEMPLATE_FLAGS = ("--chat-template", "--chat-template-file")
# What llama-server renders with no template (b11434's log of a template-less GGUF).
CHATML_EXAMPLE = (
    "<|im_start|>system\nYou are a helpful assistant<|im_end|>\n<|im_start|>user\nHello"
    "<|im_end|>\n<|im_start|>assistant\nHi there<|im_end|>\n<|im_start|>user\nHow are you?"
    "<|im_end|>\n<|im_start|>assistant\n"
)
ASSISTANT_TURN, NEXT_TURN = "Hi there", "How are you?"
# Token texts llama.cpp (llama-vocab.cpp) makes end-of-generation whatever their metadata.
EOG_TEXTS = frozenset(
    {
        "<|eot_id|>",
        "<|im_end|>",
        "<|end|>",
        "<|return|>",
        "<|call|>",
        "<end_of_turn>",
        "<|endoftext|>",
        "<|eom_id|>",
        "<EOT>",
        "_<EOT>",
        "<end_of_utterance>",
        "</s>",
    }
)
# Markers chat templates close a turn with (searched in a template's source when no
# rendered example is at hand).
TURN_CLOSERS = (
    "<|im_end|>",
    "<end_of_turn>",
    "<|eot_id|>",
    "<|end|>",
    "<|END_OF_TURN_TOKEN|>",
    "<｜end▁of▁sentence｜>",
    "<|return|>",
    "</s>",
)
# Special-token-looking markup in a rendered turn close.
_MARKUP = re.compile(r"<\|[^<>|\s]{1,40}\|>|<｜[^｜\s]{1,40}｜>|<[a-z_]{2,30}>|</s>|\[/?INST\]")
_INSTRUCT_WORDS = frozenset(
    "instruct instruction it chat sft dpo rlhf orpo kto simpo grpo assistant conversational "
    "hermes tulu zephyr openchat vicuna".split()
)
_BASE_WORDS = frozenset({"base", "pretrained", "pretrain", "pt"})
_WORD = re.compile(r"[a-z0-9]+")
MAX_LOG_BYTES = 4 * 1024 * 1024  # the model-load part of a -lv 4 log is ~50 KB
_LOG_LINE = re.compile(r"^\d+\.\d+\.\d+\.\d+ [DIWE] ")
_EOG_LINE = re.compile(r"EOG token\s*=\s*(\d+)\s+'(.*)'\s*$")
_EXAMPLE_START = "example_format: '"


@dataclass(frozen=True)
class ModelFile:
    """What the lint reads from a GGUF file's metadata."""

    path: str
    name: str = ""
    naming: tuple[tuple[str, str], ...] = ()  # (metadata key, value) of the naming keys
    chat_template: str | None = None
    tokens: tuple[str, ...] = ()
    eog_ids: frozenset[int] = frozenset()

    @property
    def eog_texts(self) -> tuple[str, ...]:
        return tuple(self.tokens[i] for i in sorted(self.eog_ids) if 0 <= i < len(self.tokens))

    def has_token(self, text: str) -> bool:
        return text in self.tokens


@dataclass(frozen=True)
class ServerLog:
    """What the server's own log says: the format it serves and its EOG tokens."""

    example_format: str | None = None
    eog: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class _Served:
    """The format the server renders and the tokens that end generation, with sources."""

    example: str | None
    example_source: str
    eog_texts: tuple[str, ...]
    eog_source: str
    template_flag: str | None
    notes: list[str] = field(default_factory=list)


def model_file(kv: GGUFKV) -> ModelFile:
    """The lint's view of a GGUF's metadata; end-of-generation ids as llama.cpp computes."""
    tokens = tuple(kv.strings("tokenizer.ggml.tokens"))
    ids = {kv.integer(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")} - {None}
    eog = {i for i in ids if isinstance(i, int)}
    eog.update(i for i, text in enumerate(tokens) if text in EOG_TEXTS)
    keys = ("general.name", "general.basename", "general.finetune", "general.type")
    naming = [(key, kv.text(key) or "") for key in keys if kv.text(key)]
    tags = kv.strings("general.tags")
    if tags:
        naming.append(("general.tags", ", ".join(tags)))
    template = kv.text("tokenizer.chat_template")
    return ModelFile(
        kv.path,
        kv.text("general.name") or Path(kv.path).name,
        tuple(naming),
        template if template and template.strip() else None,
        tokens,
        frozenset(eog),
    )


def parse_log(text: str) -> ServerLog:
    """The `example_format` and `EOG token` lines of a llama-server log (-lv 4)."""
    eog: list[tuple[int, str]] = []
    example: list[str] | None = None
    done = False
    for line in text.splitlines():
        if example is not None and not done:
            if _LOG_LINE.match(line):
                done = True
            else:
                example.append(line)
                continue
        match = _EOG_LINE.search(line)
        if match:
            eog.append((int(match.group(1)), match.group(2)))
        elif example is None and _EXAMPLE_START in line:
            example = [line.split(_EXAMPLE_START, 1)[1]]
    rendered = "\n".join(example).rstrip() if example is not None else None
    if rendered is not None and rendered.endswith("'"):
        rendered = rendered[:-1]
    return ServerLog(rendered, tuple(eog))


def _template_flag(args: Sequence[str]) -> str | None:
    for arg in args:
        name = str(arg).split("=", 1)[0]
        if name in TEMPLATE_FLAGS:
            return name
    return None


def _served(model: ModelFile, args: Sequence[str], log: ServerLog | None) -> _Served:
    flag = _template_flag(args)
    if log is not None and log.example_format:
        example, source = log.example_format, "the server's log (example_format)"
    elif flag is None and model.chat_template is None:
        example, source = CHATML_EXAMPLE, "llama-server's fallback (ChatML)"
    else:
        example, source = None, ""
    if log is not None and log.eog:
        return _Served(example, source, tuple(t for _, t in log.eog), "the server's log", flag)
    return _Served(example, source, model.eog_texts, "the GGUF's special tokens", flag)


def _pass(kind: str, reason: str, where: str) -> Finding:
    return Finding(kind, True, 0.0, reason, where)


def _template_finding(model: ModelFile, served: _Served) -> Finding:
    where = "gguf:tokenizer.chat_template"
    if served.template_flag:
        return _pass(
            TEMPLATE_KIND, f"the server is given a template ({served.template_flag})", where
        )
    if model.chat_template is not None:
        size = len(model.chat_template)
        return _pass(TEMPLATE_KIND, f"the GGUF carries a chat template ({size} chars)", where)
    missing = [m for m in ("<|im_start|>", "<|im_end|>") if not model.has_token(m)]
    reason = (
        "the GGUF has no tokenizer.chat_template and the server is given none "
        "(--chat-template): llama-server falls back to ChatML, a format this model may "
        "never have seen"
    )
    if served.example and served.example_source.startswith("the server's log"):
        reason += f"; {served.example_source} shows it: {served.example[:80]!r}"
    if missing and model.tokens:
        reason += (
            f"; {' and '.join(missing)} "
            + ("is not a token" if len(missing) == 1 else "are not tokens")
            + " of its vocabulary (read as plain text, split into pieces)"
        )
    return Finding(TEMPLATE_KIND, False, 1.0, reason, where)


def _words(value: str) -> set[str]:
    return set(_WORD.findall(value.lower()))


def _base_finding(model: ModelFile) -> Finding:
    where = "gguf:general.name"
    for key, value in model.naming:
        hit = sorted(_words(value) & _INSTRUCT_WORDS)
        if hit:
            return _pass(BASE_KIND, f"instruction-tuned: {key} {value!r} says {hit[0]!r}", where)
    for key, value in model.naming:
        hit = sorted(_words(value) & _BASE_WORDS)
        if hit:
            return Finding(
                BASE_KIND,
                False,
                1.0,
                f"a base model served for chat: {key} {value!r} says {hit[0]!r}; a base model "
                "continues the transcript instead of answering and ending its turn",
                f"gguf:{key}",
            )
    if model.chat_template is not None:
        return _pass(
            BASE_KIND, "the GGUF carries a chat template; nothing marks it a base model", where
        )
    named = ", ".join(f"{k} {v!r}" for k, v in model.naming) or "no naming metadata"
    return Finding(
        BASE_KIND,
        False,
        0.7,
        f"by every sign the file gives a base model served for chat: no chat template and "
        f"no instruction-tuning marker ({named}); a base model continues the transcript "
        "instead of answering and ending its turn",
        where,
    )


def _close_of(example: str) -> str | None:
    start = example.find(ASSISTANT_TURN)
    if start < 0:
        return None
    start += len(ASSISTANT_TURN)
    end = example.find(NEXT_TURN, start)
    return example[start : end if end >= 0 else start + 200]


def _eot_finding(model: ModelFile, served: _Served) -> Finding:
    where = "gguf:tokenizer.ggml.eos_token_id"
    eog = [t for t in served.eog_texts if t]
    eog_text = ", ".join(repr(t) for t in eog) or "none"
    if served.example is not None:
        close = _close_of(served.example)
        if close is None:
            return _pass(EOT_KIND, "the served example shows no assistant turn to read", where)
        markers = _MARKUP.findall(close)
        source = served.example_source
    elif model.chat_template is not None:
        markers = [m for m in TURN_CLOSERS if m in model.chat_template]
        source = "the GGUF's chat template"
    else:
        return _pass(EOT_KIND, "the template is given by flag: the server's log decides", where)
    closing = [m for m in markers if m in eog]
    if closing:
        return _pass(
            EOT_KIND,
            f"the served format closes the assistant's turn with {closing[0]!r}, an "
            f"end-of-generation token ({served.eog_source})",
            where,
        )
    if not markers:
        return _pass(
            EOT_KIND, f"{source} closes the assistant's turn with no special marker", where
        )
    marker = markers[0]
    absent = model.tokens and not model.has_token(marker)
    return Finding(
        EOT_KIND,
        False,
        1.0,
        f"the served format ({source}) closes the assistant's turn with {marker!r}, which is "
        f"not an end-of-generation token of this model (EOG per {served.eog_source}: "
        f"{eog_text})"
        + ("; it is not even a token of its vocabulary" if absent else "")
        + ": the model cannot end its turn the way the format expects and writes on until "
        "a limit stops it",
        where,
    )


def lint(
    model: ModelFile,
    *,
    chat: bool = True,
    args: Sequence[str] = (),
    log: ServerLog | None = None,
) -> list[Finding]:
    """The three lint findings (passed or failed) for a model served with `args`."""
    if not chat:
        why = "not a chat request: no template is applied"
        return [_pass(kind, why, "gguf") for kind in LINT_KINDS]
    served = _served(model, args, log)
    return [
        _template_finding(model, served),
        _base_finding(model),
        _eot_finding(model, served),
    ]


def _read_log(path: Path | None) -> ServerLog | None:
    if path is None or not path.is_file():
        return None
    try:
        with path.open("rb") as handle:
            text = handle.read(MAX_LOG_BYTES).decode("utf-8", "replace")
    except OSError:
        return None
    return parse_log(text)


def lint_files(
    model_path: Path | str,
    request: Mapping[str, Any],
    *,
    args: Sequence[str] = (),
    log_path: Path | None = None,
) -> tuple[list[Finding], str | None]:
    """Lint the GGUF at `model_path` for `request` (the server's log when given):
    (findings, None), or ([], why) when the file cannot be read as GGUF."""
    try:
        model = model_file(read_kv(model_path))
    except GGUFKVError as exc:
        return [], str(exc)
    chat = isinstance(request.get("messages"), list)
    return lint(model, chat=chat, args=args, log=_read_log(log_path)), None


def lint_findings(
    server: Any, request: Mapping[str, Any], log_path: Path | None = None
) -> list[Finding]:
    """The lint findings for the server config `server` (its `model` and `args`); none for
    a server by URL (no file to read)."""
    model = getattr(server, "model", None)
    if model is None:
        return []
    args = [str(a) for a in getattr(server, "args", ()) or ()]
    findings, _ = lint_files(Path(str(model)), request, args=args, log_path=log_path)
    return findings
