"""`curl -v` transcripts: `*` info lines, `> ` request lines, `< ` response lines, then the
body (`{ [N bytes data]` progress lines skipped). The response part becomes the same
`HTTP/1.1 ...` head + body text that `curl -i` prints, so one body reader serves both."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["VerboseTranscript", "looks_like_verbose", "read_verbose"]

_INFO = re.compile(r"^(?:\*(?:\s|$)|Note: )")
_PROGRESS = re.compile(r"^[{}] \[\d+ bytes data\]")
_RESPONSE_STATUS = re.compile(r"^< HTTP/\d(?:\.\d)?\s+\d{3}", re.MULTILINE)


def looks_like_verbose(text: str) -> bool:
    """The first non-blank line is a `curl -v` line and a response status line follows."""
    for line in text.splitlines():
        if line.strip():
            first = line.lstrip()
            break
    else:
        return False
    starts = bool(_INFO.match(first)) or first.startswith(("> ", "< "))
    return starts and bool(_RESPONSE_STATUS.search(text))


@dataclass
class VerboseTranscript:
    """What a `curl -v` transcript says about the exchange."""

    method: str | None = None
    target: str | None = None
    request_headers: list[tuple[str, str]] = field(default_factory=list)
    tls: bool = False
    response: str = ""  # `HTTP/1.1 200 OK` head, blank line, body (as `curl -i` prints)
    body_line: int = 1  # the line of the transcript where the body starts

    @property
    def url(self) -> str | None:
        host = next((v for k, v in self.request_headers if k.lower() == "host"), None)
        if self.target is None or host is None:
            return self.target
        if self.target.startswith(("http://", "https://")):
            return self.target
        return f"{'https' if self.tls else 'http'}://{host}{self.target}"


def _request_line(line: str, transcript: VerboseTranscript) -> None:
    content = line[2:] if line.startswith("> ") else ""
    if not content.strip():
        return
    if transcript.method is None:
        method, _, rest = content.partition(" ")
        transcript.method = method
        transcript.target = rest.rsplit(" HTTP/", 1)[0] or None
        return
    name, colon, value = content.partition(":")
    if colon:
        transcript.request_headers.append((name.strip(), value.strip()))


def read_verbose(text: str, line_offset: int = 0) -> VerboseTranscript:
    """Split a transcript into its request facts and the `curl -i`-style response text."""
    transcript = VerboseTranscript()
    head: list[str] = []
    body: list[str] = []
    body_line: int | None = None
    for number, raw in enumerate(text.splitlines(), start=1 + line_offset):
        line = raw.rstrip("\r")
        if body_line is None and (_INFO.match(line) or _PROGRESS.match(line) or not line):
            if "SSL connection" in line or "TLS" in line or "ALPN" in line:
                transcript.tls = True
            continue
        if line.startswith((">", "<")) and body_line is None:
            if line.startswith(">"):
                _request_line(line, transcript)
            else:
                head.append(line[2:] if line.startswith("< ") else "")
            continue
        if body_line is not None and (_INFO.match(line) or _PROGRESS.match(line)):
            continue  # "* Connection #0 to host ... left intact" after the body
        if body_line is None:
            body_line = number
        body.append(line)
    while head and not head[-1]:
        head.pop()
    transcript.response = "\n".join(head) + "\n\n" + "\n".join(body)
    transcript.body_line = body_line if body_line is not None else 1 + line_offset
    return transcript
