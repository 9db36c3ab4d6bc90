"""Split a pasted command line into words in one linear pass.

Two dialects, chosen from the text:
- POSIX shells (bash, zsh; Chrome's "Copy as cURL (bash)"): '...', "...", backslash
  escapes, `\\`-newline continuations and ANSI-C `$'...'` strings.
- Windows cmd (Chrome's "Copy as cURL (cmd)"): `^` escapes and `^`-newline continuations
  at the cmd level, then the C runtime's argument rules ("...", `\\"`).

The command ends at the first newline that is not quoted or escaped; what follows is
returned as the rest (a pasted response). `shlex.split` would do the POSIX part, but it
cannot say where the command ends (so callers re-split growing prefixes: quadratic), its
token building is itself quadratic on a multi-megabyte word, and it knows neither `$'...'`
nor cmd.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["Command", "ShellSyntaxError", "split_command"]


class ShellSyntaxError(ValueError):
    """A command that cannot be split; `line` is the 1-based line where the problem starts."""

    def __init__(self, message: str, line: int) -> None:
        super().__init__(message)
        self.line = line


@dataclass
class Command:
    """The words of the command, its first line, and the text after it with its first line."""

    argv: list[str]
    line: int
    rest: str
    rest_line: int
    dialect: str


_CMD_START = re.compile(r"[ \t]*\S*curl(?:\.exe)?[ \t]+\^\"")
_CMD_CONTINUATION = re.compile(r"\^\r?\n")
_POSIX_PLAIN = re.compile(r"[^ \t\r\n'\"\\$]+")
_DOUBLE_PLAIN = re.compile(r"[^\"\\]+")
_ANSI_PLAIN = re.compile(r"[^'\\]+")
_CMD_PLAIN = re.compile(r"[^\"^\n]+")
_CRT_PLAIN = re.compile(r"[^\s\"\\]+")
_ANSI_ESCAPE = re.compile(
    r"\\(x[0-9A-Fa-f]{1,2}|u[0-9A-Fa-f]{1,4}|U[0-9A-Fa-f]{1,8}|[0-7]{1,3}|c.|.)", re.DOTALL
)
_ANSI_SIMPLE = {
    "a": "\a",
    "b": "\b",
    "e": "\x1b",
    "E": "\x1b",
    "f": "\f",
    "n": "\n",
    "r": "\r",
    "t": "\t",
    "v": "\v",
    "\\": "\\",
    "'": "'",
    '"': '"',
    "?": "?",
}


def split_command(text: str) -> Command:
    """The first command of `text` (leading blank lines skipped) split into words."""
    start = 0
    while True:
        newline = text.find("\n", start)
        if newline == -1 or text[start:newline].strip():
            break
        start = newline + 1
    line = text.count("\n", 0, start) + 1
    posix_error: ShellSyntaxError | None = None
    try:
        argv, end = _posix_words(text, start, line)
    except ShellSyntaxError as exc:
        posix_error, argv, end = exc, [], len(text)
    dialect = "cmd" if _is_cmd(text, start, argv, end, posix_error) else "posix"
    if dialect == "cmd":
        command_line, end = _cmd_level(text, start)
        argv = _crt_split(command_line)
    elif posix_error is not None:
        raise posix_error
    rest_line = line + text.count("\n", start, end)
    return Command(argv, line, text[end:], rest_line, dialect)


def _is_cmd(
    text: str, start: int, argv: list[str], end: int, posix_error: ShellSyntaxError | None
) -> bool:
    """Windows cmd syntax: Chrome's `curl ^"URL^"`, or a `^` ending the first line (a
    continuation that a POSIX shell would take as the end of the command)."""
    if _CMD_START.match(text, start):
        return True
    if posix_error is not None:
        return bool(_CMD_CONTINUATION.search(text, start))
    return bool(argv) and argv[-1] == "^" and text[start:end].rstrip("\r\n").endswith("^")


def _line_at(text: str, pos: int, base: int, start: int) -> int:
    return base + text.count("\n", start, pos)


def _posix_words(text: str, pos: int, base_line: int) -> tuple[list[str], int]:
    """POSIX words up to the first unquoted newline; returns them and where the rest starts."""
    start = pos
    words: list[str] = []
    parts: list[str] = []
    in_word = False
    n = len(text)
    while pos < n:
        char = text[pos]
        if char in " \t\r\n":
            if in_word:
                words.append("".join(parts))
                parts, in_word = [], False
            pos += 1
            if char == "\n":
                return words, pos
            continue
        if char == "\\":
            pos, escaped = _posix_backslash(text, pos, parts)
            in_word = in_word or escaped
            continue
        in_word = True
        if char == "'":
            end = text.find("'", pos + 1)
            if end == -1:
                line = _line_at(text, pos, base_line, start)
                raise ShellSyntaxError(f"No closing quotation (' opened on line {line})", line)
            parts.append(text[pos + 1 : end])
            pos = end + 1
        elif char == '"':
            pos = _double_quoted(text, pos, parts, base_line, start)
        elif char == "$":
            if text.startswith("$'", pos):
                pos = _ansi_c_quoted(text, pos, parts, base_line, start)
            else:
                parts.append("$")
                pos += 1
        else:
            match = _POSIX_PLAIN.match(text, pos)
            assert match is not None  # char is none of the specials above
            parts.append(match.group(0))
            pos = match.end()
    if in_word:
        words.append("".join(parts))
    return words, n


def _posix_backslash(text: str, pos: int, parts: list[str]) -> tuple[int, bool]:
    """A backslash outside quotes; returns the next position and whether it added a char."""
    following = text[pos + 1 : pos + 3]
    if following.startswith("\n"):
        return pos + 2, False  # continuation: the backslash-newline disappears
    if following == "\r\n":
        return pos + 3, False
    if following:
        parts.append(following[0])
        return pos + 2, True
    return pos + 1, False  # a lone backslash at the very end


def _double_quoted(text: str, pos: int, parts: list[str], base_line: int, start: int) -> int:
    opened = pos
    pos += 1
    n = len(text)
    while pos < n:
        char = text[pos]
        if char == '"':
            return pos + 1
        if char == "\\":
            following = text[pos + 1 : pos + 2]
            if following == "\n":
                pos += 2
            elif following and following in '$`"\\':
                parts.append(following)
                pos += 2
            else:
                parts.append("\\")
                pos += 1
            continue
        match = _DOUBLE_PLAIN.match(text, pos)
        assert match is not None
        parts.append(match.group(0))
        pos = match.end()
    line = _line_at(text, opened, base_line, start)
    raise ShellSyntaxError(f'No closing quotation (" opened on line {line})', line)


def _ansi_c_quoted(text: str, pos: int, parts: list[str], base_line: int, start: int) -> int:
    opened = pos
    pos += 2
    n = len(text)
    while pos < n:
        char = text[pos]
        if char == "'":
            return pos + 1
        if char == "\\":
            match = _ANSI_ESCAPE.match(text, pos)
            if match is None:  # a backslash at the very end
                break
            parts.append(_ansi_escape(match.group(1), _line_at(text, pos, base_line, start)))
            pos = match.end()
            continue
        match = _ANSI_PLAIN.match(text, pos)
        assert match is not None
        parts.append(match.group(0))
        pos = match.end()
    line = _line_at(text, opened, base_line, start)
    raise ShellSyntaxError(f"No closing quotation ($' opened on line {line})", line)


def _ansi_escape(escape: str, line: int) -> str:
    head = escape[0]
    if head in _ANSI_SIMPLE and len(escape) == 1:
        return _ANSI_SIMPLE[head]
    if head in "xuU" and len(escape) > 1:
        code = int(escape[1:], 16)
    elif head in "01234567":
        code = int(escape, 8) & 0xFF
    elif head == "c" and len(escape) == 2:
        code = ord(escape[1].upper()) ^ 0x40
    else:
        return "\\" + escape  # bash keeps unknown escapes as written
    if 0xD800 <= code <= 0xDFFF or code > 0x10FFFF:
        raise ShellSyntaxError(f"$'...' escape \\{escape} is not a character", line)
    return chr(code)


def _cmd_level(text: str, pos: int) -> tuple[str, int]:
    """cmd.exe's pass: `^` escapes the next character outside "...", `^`-newline joins the
    next line (whose first character is then escaped). Returns the command line and the
    position after it."""
    out: list[str] = []
    in_quotes = False
    n = len(text)
    while pos < n:
        char = text[pos]
        if char == "\n":
            return "".join(out), pos + 1
        if char == '"':
            in_quotes = not in_quotes
            out.append(char)
            pos += 1
        elif char == "^" and not in_quotes:
            pos += 1
            if text.startswith("\r\n", pos):
                pos += 2
            elif text.startswith("\n", pos):
                pos += 1
            else:
                out.append(text[pos : pos + 1])
                pos += 1
                continue
            if pos < n:  # the character after a continuation is taken literally
                out.append(text[pos])
                pos += 1
        else:
            match = _CMD_PLAIN.match(text, pos)
            if match is None:  # a caret inside "...": literal
                out.append(char)
                pos += 1
                continue
            out.append(match.group(0))
            pos = match.end()
    return "".join(out), n


def _crt_split(line: str) -> list[str]:
    """The C runtime's argument rules: whitespace splits outside quotes, `"` toggles,
    backslashes before `"` escape it. Runs of backslashes elsewhere are halved too, as
    Chrome's cmd export doubles every backslash (so `\\\\n` in JSON stays an escape)."""
    words: list[str] = []
    parts: list[str] = []
    in_word = in_quotes = False
    pos, n = 0, len(line)
    while pos < n:
        char = line[pos]
        if char in " \t\r" and not in_quotes:
            if in_word:
                words.append("".join(parts))
                parts, in_word = [], False
            pos += 1
            continue
        in_word = True
        if char == '"':
            in_quotes = not in_quotes
            pos += 1
        elif char == "\\":
            end = pos
            while end < n and line[end] == "\\":
                end += 1
            count = end - pos
            if end < n and line[end] == '"':
                parts.append("\\" * (count // 2))
                if count % 2:
                    parts.append('"')
                    end += 1
            else:
                parts.append("\\" * ((count + 1) // 2))
            pos = end
        else:
            match = _CRT_PLAIN.match(line, pos)
            if match is None:  # whitespace inside quotes
                parts.append(char)
                pos += 1
                continue
            parts.append(match.group(0))
            pos = match.end()
    if in_word:
        words.append("".join(parts))
    return words
