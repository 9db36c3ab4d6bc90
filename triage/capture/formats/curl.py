"""The `curl` format: a curl command line (bash, Chrome's "Copy as cURL") plus its response,
given as a file or pasted after the command (`curl -i` / `-N` output)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from triage.capture.body import parse_body
from triage.capture.common import (
    Body,
    check_depth,
    exchange_from_body,
    guarded,
    reject_constant,
    request_body,
    sha256_of,
)
from triage.capture.formats import CaptureFormat
from triage.capture.model import CaptureError, Exchange
from triage.capture.reading import decode, read_beside
from triage.capture.redact import redact_headers
from triage.capture.shellwords import ShellSyntaxError, split_command
from triage.capture.verbose import looks_like_verbose, read_verbose

__all__ = ["FORMAT", "looks_like_curl", "parse_curl", "register"]

# curl options that take a value (short letters and long names); everything else is a flag.
_CURL_SHORT_WITH_ARG = set("dHXoubcAemwxFTKErUyYzCDPQtv") - {"v"}
_CURL_LONG_WITH_ARG = {
    "data",
    "data-raw",
    "data-binary",
    "data-ascii",
    "data-urlencode",
    "json",
    "header",
    "request",
    "url",
    "output",
    "user",
    "cookie",
    "cookie-jar",
    "user-agent",
    "referer",
    "max-time",
    "connect-timeout",
    "write-out",
    "proxy",
    "form",
    "form-string",
    "upload-file",
    "config",
    "cert",
    "key",
    "cacert",
    "capath",
    "resolve",
    "connect-to",
    "retry",
    "retry-delay",
    "retry-max-time",
    "limit-rate",
    "interface",
    "dump-header",
    "trace",
    "trace-ascii",
    "stderr",
    "oauth2-bearer",
    "aws-sigv4",
    "proxy-user",
    "variable",
    "unix-socket",
    "abstract-unix-socket",
    "max-filesize",
    "keepalive-time",
    "tls-max",
    "ciphers",
    "pass",
    "key-type",
    "cert-type",
    "doh-url",
    "dns-servers",
    "local-port",
    "max-redirs",
    "noproxy",
    "preproxy",
    "proxy-header",
    "range",
    "speed-limit",
    "speed-time",
    "time-cond",
    "url-query",
    "expect100-timeout",
    "happy-eyeballs-timeout-ms",
    "output-dir",
    "proto",
    "proto-redir",
    "request-target",
    "sasl-authzid",
    "service-name",
    "socks5",
    "socks5-hostname",
    "socks4",
    "socks4a",
    "tls13-ciphers",
    "create-file-mode",
    "etag-save",
    "etag-compare",
    "netrc-file",
    "login-options",
    "mail-from",
    "mail-rcpt",
    "hostpubmd5",
    "pinnedpubkey",
    "crlfile",
    "curves",
    "krb",
    "ftp-port",
    "quote",
    "telnet-option",
}
_CURL_SHORT_TO_LONG = {
    "d": "data",
    "H": "header",
    "X": "request",
    "u": "user",
    "b": "cookie",
    "m": "max-time",
    "U": "proxy-user",
    "o": "output",
    "w": "write-out",
}
_CURL_DATA_OPTIONS = {"data", "data-raw", "data-binary", "data-ascii", "data-urlencode", "json"}


@dataclass
class _CurlRequest:
    url: str | None = None
    method: str | None = None
    headers: list[tuple[str, str]] = field(default_factory=list)
    data: list[tuple[str, str]] = field(default_factory=list)  # (option, value)
    max_time: float | None = None


def _parse_curl_args(argv: list[str], file: str, line: int) -> _CurlRequest:
    while argv and argv[0] in ("$", "%", ">", "#"):
        argv = argv[1:]
    if argv and argv[0].startswith("$") and argv[0] != "$":
        argv[0] = argv[0].lstrip("$")
    if not argv or not (argv[0] == "curl" or argv[0].endswith("/curl") or argv[0] == "curl.exe"):
        raise CaptureError(file, line, "not a curl command (it must start with `curl`)")
    result = _CurlRequest()
    i = 1
    options_done = False

    def take_value(name: str, inline: str | None) -> str:
        nonlocal i
        if inline is not None:
            return inline
        i += 1
        if i >= len(argv):
            raise CaptureError(file, line, f"curl option --{name} has no value")
        return argv[i]

    while i < len(argv):
        arg = argv[i]
        if options_done or not arg.startswith("-") or arg == "-":
            if result.url is None:
                result.url = arg
            i += 1
            continue
        if arg == "--":
            options_done = True
            i += 1
            continue
        if arg.startswith("--"):
            name, eq, inline = arg[2:].partition("=")
            value = None
            if name in _CURL_LONG_WITH_ARG:
                value = take_value(name, inline if eq else None)
            _apply_curl_option(result, name, value)
            i += 1
            continue
        # Short options may be clustered: -sSX POST, -sXPOST, -d@body.json
        cluster = arg[1:]
        position = 0
        while position < len(cluster):
            letter = cluster[position]
            if letter in _CURL_SHORT_WITH_ARG:
                rest = cluster[position + 1 :]
                value = take_value(letter, rest if rest else None)
                _apply_curl_option(result, _CURL_SHORT_TO_LONG.get(letter, letter), value)
                break
            _apply_curl_option(result, letter, None)
            position += 1
        i += 1
    return result


def _apply_curl_option(request: _CurlRequest, name: str, value: str | None) -> None:
    if value is None:
        return
    if name in _CURL_DATA_OPTIONS:
        request.data.append((name, value))
        if name == "json":
            request.headers.append(("Content-Type", "application/json"))
            request.headers.append(("Accept", "application/json"))
    elif name == "header":
        header_name, colon, header_value = value.partition(":")
        if colon:
            request.headers.append((header_name.strip(), header_value.strip()))
    elif name == "request":
        request.method = value
    elif name == "url":
        request.url = value
    elif name == "user" or name == "proxy-user":
        encoded = base64.b64encode(value.encode("utf-8", "surrogatepass")).decode()
        header = "Authorization" if name == "user" else "Proxy-Authorization"
        request.headers.append((header, f"Basic {encoded}"))
    elif name == "oauth2-bearer":
        request.headers.append(("Authorization", f"Bearer {value}"))
    elif name == "cookie":
        request.headers.append(("Cookie", value))
    elif name == "max-time":
        try:
            request.max_time = float(value)
        except ValueError:
            request.max_time = None


def _curl_body(
    request: _CurlRequest, file: str, line: int, base_dir: Path | None
) -> tuple[str, bytes]:
    """The request body the curl command sends, and the bytes read from any @file."""
    if not request.data:
        raise CaptureError(
            file,
            line,
            "curl command has no request body (-d/--data/--data-raw/--data-binary/--json)",
        )
    pieces: list[str] = []
    extra: list[bytes] = []
    for option, value in request.data:
        if value.startswith("@") and option != "data-raw":
            target = value[1:]
            if target == "-":
                raise CaptureError(
                    file, line, "the body comes from stdin (@-); save it to a file and use @FILE"
                )
            if base_dir is None:
                raise CaptureError(
                    file,
                    line,
                    f"the body is read from a file ({value}); give the capture as a file",
                )
            path, raw = read_beside(base_dir, target, file=file, line=line)
            body_text, _ = decode(raw, str(path))
            if option in ("data", "data-ascii"):
                body_text = body_text.replace("\r", "").replace("\n", "")  # what curl -d does
            pieces.append(body_text)
            extra.append(raw)
        else:
            pieces.append(value)
    return "&".join(pieces), b"\0".join(extra)


@guarded
def parse_curl(
    command: bytes | str,
    response: bytes | str | None = None,
    *,
    file: str = "<curl>",
    response_file: str | None = None,
    base_dir: str | Path | None = None,
) -> Exchange:
    """A curl command line plus its response (given, or the output following the command)."""
    text, raw = decode(command, file)
    if not text.strip():
        raise CaptureError(file, None, "empty file")
    if not looks_like_curl(text) and looks_like_verbose(text):
        return _parse_transcript_only(text, raw, file)
    try:
        split = split_command(text)
    except ShellSyntaxError as exc:
        raise CaptureError(file, exc.line, f"cannot split the curl command: {exc}") from None
    argv, line, trailing, trailing_line = split.argv, split.line, split.rest, split.rest_line
    request = _parse_curl_args(argv, file, line)
    base = Path(base_dir) if base_dir is not None else None
    body_text, body_raw = _curl_body(request, file, line, base)
    if not body_text.strip():
        raise CaptureError(file, line, "curl request body is empty")
    try:
        body_value = json.loads(body_text, parse_constant=reject_constant)
    except json.JSONDecodeError as exc:
        raise CaptureError(
            file,
            line,
            f"request body (-d) is not JSON: {exc.msg} "
            f"(body line {exc.lineno}, column {exc.colno})",
        ) from None
    except (ValueError, RecursionError):
        raise CaptureError(file, line, "request body (-d) is not valid JSON") from None
    check_depth(body_value, file)
    request_value = request_body(body_value, file, f"line {line}, request body")
    parts = [raw]
    if body_raw:
        parts.append(body_raw)
    if response is not None:
        response_file = response_file or file
        response_text, response_raw = decode(response, response_file)
        parts.append(response_raw)
        body = parse_body(response_text, response_file)
    elif trailing.strip():
        body = _output_body(trailing, file, trailing_line)
    else:
        raise CaptureError(
            file,
            None,
            "no response: give the response file (--response) "
            "or paste the output after the command",
        )
    method = request.method or "POST"
    return exchange_from_body(
        request_value,
        body,
        source_format="curl",
        file=file,
        sha256=sha256_of(*parts),
        url=request.url,
        method=method,
        request_headers=redact_headers(request.headers),
    )


def _output_body(trailing: str, file: str, trailing_line: int) -> Body:
    """The output pasted after the command: `curl -i`/`-N` output, or a `curl -v` transcript."""
    if looks_like_verbose(trailing):
        transcript = read_verbose(trailing, trailing_line - 1)
        head_lines = transcript.response.count("\n", 0, transcript.response.find("\n\n") + 2)
        return parse_body(
            transcript.response, file, line_offset=transcript.body_line - 1 - head_lines
        )
    return parse_body(trailing, file, line_offset=trailing_line - 1)


def _parse_transcript_only(text: str, raw: bytes, file: str) -> Exchange:
    """A `curl -v` transcript without its command line: the request line and headers are
    known, the request body is not (curl -v does not print it)."""
    transcript = read_verbose(text)
    if transcript.method is None:
        raise CaptureError(file, None, "curl -v transcript has no `> METHOD /path` request line")
    return exchange_from_body(
        {},
        _output_body(text, file, 1),
        source_format="curl",
        file=file,
        sha256=sha256_of(raw),
        url=transcript.url,
        method=transcript.method,
        request_headers=redact_headers(transcript.request_headers),
    )


def looks_like_curl(text: str) -> bool:
    """The first word (after a shell prompt) is curl."""
    first = text.lstrip("\ufeff").lstrip().split(None, 2)
    if not first:
        return False
    head = first[0]
    if head in ("$", "%", ">") and len(first) > 1:
        head = first[1]
    head = head.lstrip("$")
    return head == "curl" or head.endswith("/curl") or head == "curl.exe"


def _sniff(text: str) -> bool:
    return looks_like_curl(text) or looks_like_verbose(text)


def _parse(text: str, *, file: str, base_dir: Path | None = None) -> list[Exchange]:
    return [parse_curl(text, file=file, base_dir=base_dir)]


FORMAT = CaptureFormat(
    id="curl",
    label="curl command (bash/cmd, Chrome's Copy as cURL) with its -i/-N/-v output or "
    "--response, or a curl -v transcript",
    suffixes=(),
    priority=10,
    sniff=_sniff,
    parse=_parse,
)


def register(catalogue: Any) -> None:
    """Add the curl format to the catalogue."""
    catalogue.formats.add(FORMAT)
