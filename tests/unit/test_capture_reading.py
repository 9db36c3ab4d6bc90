"""Bounded reading (issue 18, defect 1): devices, FIFOs and `curl -d @PATH` outside the
capture's folder are refused; nothing reads more than the size limit.

The hostile cases run in a child process under RLIMIT_AS and a wall-clock timeout, so a
regression (reading /dev/zero to the end, blocking on a FIFO) fails the test instead of
taking the machine down or hanging the suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from triage import capture
from triage.capture import CaptureError, load_file, read_file

OK = '{"choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}}]}'
MEMORY_LIMIT = 1536 * 1024 * 1024

CHILD = textwrap.dedent(
    """
    import json, resource, sys
    resource.setrlimit(resource.RLIMIT_AS, ({limit}, {limit}))
    from click.testing import CliRunner
    from triage.capture import CaptureError, load_file, read_file
    from triage.cli import cli

    folder = sys.argv[1]
    results = {{}}
    for label, call in [
        ("read /dev/zero", lambda: read_file("/dev/zero")),
        ("read fifo", lambda: read_file(folder + "/pipe")),
        ("curl @/dev/zero", lambda: load_file(folder + "/zero-absolute.curl")),
        ("curl @link-to-zero", lambda: load_file(folder + "/zero-link.curl")),
        ("curl @fifo", lambda: load_file(folder + "/fifo.curl")),
    ]:
        try:
            call()
            results[label] = "accepted"
        except CaptureError as exc:
            results[label] = str(exc)
    for label, args in [("cli check fifo", ["check", folder + "/pipe"]),
                        ("cli check zero curl", ["check", folder + "/zero-link.curl"])]:
        result = CliRunner().invoke(cli, args)
        results[label] = [result.exit_code, result.output]
    print(json.dumps(results))
    """
)


@pytest.fixture()
def hostile_folder(tmp_path: Path) -> Path:
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "link-to-zero.json").symlink_to("/dev/zero")
    for name, target in [
        ("zero-absolute.curl", "/dev/zero"),
        ("zero-link.curl", "link-to-zero.json"),
        ("fifo.curl", "pipe"),
    ]:
        (tmp_path / name).write_text(
            f"curl http://h/v1/chat/completions -d @{target}\n{OK}\n", encoding="utf-8"
        )
    return tmp_path


def test_devices_and_fifos_are_refused_without_reading_them(hostile_folder: Path) -> None:
    script = CHILD.format(limit=MEMORY_LIMIT)
    done = subprocess.run(
        [sys.executable, "-c", script, str(hostile_folder)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    assert "is a character device, not a regular file" in results["read /dev/zero"]
    assert "is a FIFO (named pipe), not a regular file" in results["read fifo"]
    for label in ("curl @/dev/zero", "curl @link-to-zero"):
        assert "is outside the capture's folder" in results[label], label
        assert ":1:" in results[label]  # names the capture file and its line
    assert "not a regular file" in results["curl @fifo"]
    for label in ("cli check fifo", "cli check zero curl"):
        exit_code, output = results[label]
        assert exit_code == 1, label
        assert "Traceback" not in output


def test_body_file_under_the_capture_folder_is_read(tmp_path: Path) -> None:
    (tmp_path / "bodies").mkdir()
    (tmp_path / "bodies" / "req.json").write_text('{"messages": []}', encoding="utf-8")
    (tmp_path / "cmd.curl").write_text(
        f"curl http://h/v1/chat/completions -d @bodies/req.json\n{OK}\n", encoding="utf-8"
    )
    assert load_file(tmp_path / "cmd.curl")[0].request == {"messages": []}


@pytest.mark.parametrize("target", ["../secret.json", "~/secret.json", "{outside}"])
def test_body_file_outside_the_capture_folder_is_refused(tmp_path: Path, target: str) -> None:
    outside = tmp_path / "secret.json"
    outside.write_text('{"messages": [], "api_key": "x"}', encoding="utf-8")
    folder = tmp_path / "captures"
    folder.mkdir()
    target = target.format(outside=outside)
    (folder / "cmd.curl").write_text(
        f"curl http://h/v1/chat/completions -d @{target}\n{OK}\n", encoding="utf-8"
    )
    with pytest.raises(CaptureError) as info:
        load_file(folder / "cmd.curl")
    assert info.value.location == 1
    assert "outside the capture's folder" in str(info.value) or "not found" in str(info.value)


def test_size_limit_does_not_trust_st_size(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(capture, "MAX_CAPTURE_BYTES", 200)
    body = tmp_path / "body.json"
    body.write_bytes(b" " * 184 + b'{"messages": []}')
    assert len(read_file(body)) == 200
    command = tmp_path / "cmd.curl"
    command.write_text(f"curl http://h -d @body.json\n{OK}\n", encoding="utf-8")
    assert load_file(command)[0].request == {"messages": []}
    body.write_bytes(b" " * 185 + b'{"messages": []}')
    with pytest.raises(CaptureError, match="over the 200 byte limit"):
        read_file(body)
    # A body file over the limit is refused like the capture itself.
    with pytest.raises(CaptureError, match=r"body\.json: file is 201 bytes, over the 200"):
        load_file(command)
