"""Curl commands as browsers and shells write them: one linear split, bash `$'...'` (Chrome's
"Copy as cURL (bash)"), Windows cmd `^` continuations and Chrome's "Copy as cURL (cmd)"."""

from __future__ import annotations

import json
import re
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from triage.capture import CaptureError, detect_format, parse, parse_curl
from triage.capture.shellwords import ShellSyntaxError, split_command

OK = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}'
URL = "http://127.0.0.1:8080/v1/chat/completions"


def chrome_bash(value: str) -> str:
    """Chrome DevTools' escapeStringPosix (front_end/panels/network/NetworkLogView.ts)."""
    if re.search(r"[\x00-\x1f\x7f-\x9f!]|'", value):
        escaped = (
            value.replace("\\", "\\\\")
            .replace("'", "\\'")
            .replace("\n", "\\n")
            .replace("\r", "\\r")
        )
        escaped = re.sub(r"[\x00-\x1f\x7f-\x9f!]", lambda m: f"\\u{ord(m.group(0)):04x}", escaped)
        return "$'" + escaped + "'"
    return "'" + value + "'"


def chrome_cmd(value: str) -> str:
    """Chrome DevTools' escapeStringWin: `^"` encapsulation, `\\"` for quotes, `^` before
    every unsafe character, `%^` before variable names, `^` + two newlines for a newline."""
    escaped = value.replace("\\", "\\\\").replace('"', '\\"')
    escaped = re.sub(r"[^a-zA-Z0-9\s_\-:=+~'/.,?;()*`]", lambda m: "^" + m.group(0), escaped)
    escaped = re.sub(r"%(?=[a-zA-Z0-9_])", "%^", escaped)
    escaped = re.sub(r"\r?\n", "^\n\n", escaped)
    return '^"' + escaped + '^"'


def chrome_command(body: str, escape, continuation: str) -> str:
    parts = [
        f"curl {escape(URL)}",
        f"-H {escape('Accept: */*')}",
        f"-H {escape('Content-Type: application/json')}",
        f"--data-raw {escape(body)}",
    ]
    return continuation.join(parts)


BODY = {
    "model": "m",
    "messages": [
        {"role": "system", "content": 'it\'s 100% "quoted" ^caret! back\\slash\ttab'},
        {"role": "user", "content": "line one\nline two, café ü 日本 {x} <y> & | $HOME %PATH%"},
    ],
}


@pytest.mark.parametrize(
    ("escape", "continuation"),
    [(chrome_bash, " \\\n  "), (chrome_cmd, " ^\n  "), (chrome_cmd, " ^\r\n  ")],
    ids=["bash", "cmd", "cmd-crlf"],
)
@pytest.mark.parametrize("separators", [None, (",", ":")], ids=["spaced", "compact"])
def test_chrome_copy_as_curl_gives_the_request_back(escape, continuation, separators):
    body = json.dumps(BODY, ensure_ascii=False, separators=separators)
    command = chrome_command(body, escape, continuation)
    assert detect_format(command + "\n" + OK, "pasted.txt") == "curl"
    ex = parse(command + "\n" + OK, file="pasted.txt")[0]
    assert ex.request == BODY
    assert ex.url == URL
    assert ex.request_headers["content-type"] == "application/json"
    assert ex.response["choices"][0]["message"]["content"] == "ok"


def test_chrome_bash_ansi_c_quoting_that_shlex_cannot_split():
    body = '{"messages": [{"role": "user", "content": "don\'t\\n"}]}'
    command = f"curl {URL} --data-raw {chrome_bash(body)}"
    assert command.count("$'") == 1
    with pytest.raises(ValueError, match="No closing quotation"):
        shlex.split(command)  # what the capture parser used to do
    ex = parse_curl(command, OK, file="c.sh")
    assert ex.request["messages"][0]["content"] == "don't\n"


def test_windows_caret_continuations_and_crt_quotes():
    command = (
        f"curl.exe {URL} ^\n"
        '  -H "Content-Type: application/json" ^\n'
        '  -H "Authorization: Bearer sk-windows-0123456789abcdef" ^\n'
        '  -d "{\\"messages\\": [{\\"role\\": \\"user\\", \\"content\\": \\"hi there\\"}]}"\n'
    )
    ex = parse_curl(command + OK, file="c.cmd")
    assert ex.request == {"messages": [{"role": "user", "content": "hi there"}]}
    assert ex.url == URL
    assert "sk-windows" not in json.dumps(ex.to_dict())


def test_ansi_c_escapes():
    words = split_command("x $'a\\tb\\x41\\u00e9\\U0001F600\\101\\cA\\e\\q\\''").argv
    assert words == ["x", "a\tbA\u00e9\U0001f600A\x01\x1b\\q'"]
    with pytest.raises(ShellSyntaxError, match="not a character"):
        split_command("x $'\\ud800'")


def test_where_the_command_ends_and_the_output_starts():
    text = "\n\n$ curl -d '{\n  \"a\": 1\n}' \\\n  http://h/x\nHTTP/1.1 200 OK\n\nbody\n"
    split = split_command(text)
    assert split.argv == ["$", "curl", "-d", '{\n  "a": 1\n}', "http://h/x"]
    assert split.line == 3
    assert split.rest == "HTTP/1.1 200 OK\n\nbody\n"
    assert split.rest_line == 7
    assert text.splitlines()[split.rest_line - 1] == "HTTP/1.1 200 OK"


def test_unclosed_quote_names_the_line_it_opens_on():
    with pytest.raises(CaptureError) as info:
        parse_curl("curl http://h \\\n  -H 'A: b' \\\n  -d '{\"a\": 1}\n", OK, file="c.sh")
    assert info.value.location == 3
    assert "No closing quotation" in str(info.value)


words = st.lists(
    st.text(
        alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"),
        max_size=20,
    ),
    min_size=1,
    max_size=6,
)


@settings(max_examples=300, deadline=None)
@given(words)
def test_posix_split_agrees_with_shell_quoting(argv):
    # shlex.quote keeps newlines inside '...', so the whole text is still one command.
    command = " ".join(shlex.quote(word) for word in argv)
    assert split_command(command).argv == argv


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_chrome_escapers_round_trip(value):
    value = value.replace("\x00", "")
    for escape in (chrome_bash, chrome_cmd):
        command = "curl " + escape(value)
        if escape is chrome_cmd and "\r" in value:
            continue  # Chrome's cmd export turns \r\n into a newline: not reversible
        assert split_command(command).argv == ["curl", value], escape.__name__
