"""An upstream that streams until it is killed: run as a process of its own
(`python dying_upstream.py PORT_FILE MODE`), so a test can SIGKILL it mid-response the way a
llama-server crash ends a reply.

MODE `sse`: every POST gets a chunked `text/event-stream` reply, one chat chunk every 20 ms,
forever. MODE `json`: a JSON reply whose Content-Length promises more bytes than are ever sent.
Anything else (GET /props) gets a 404. Writes its port to PORT_FILE once it listens, and one
line `streaming` to stdout when the first reply is under way.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from pathlib import Path

CHUNK = {
    "id": "chatcmpl-1",
    "object": "chat.completion.chunk",
    "choices": [{"index": 0, "delta": {"content": "la"}, "finish_reason": None}],
}


def _read_request(conn: socket.socket) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        part = conn.recv(65536)
        if not part:
            return b""
        data += part
    head, _, body = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(body) < length:
        part = conn.recv(65536)
        if not part:
            break
        body += part
    return head


def _serve(conn: socket.socket, mode: str) -> None:
    with conn:
        head = _read_request(conn)
        if not head.startswith(b"POST"):
            conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
            return
        if mode == "json":
            body = json.dumps({"choices": [{"message": {"content": "x" * 100}}]}).encode()
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                + f"Content-Length: {len(body) * 10}\r\n\r\n".encode()
                + body
            )
            print("streaming", flush=True)
            time.sleep(3600)
            return
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n"
        )
        event = b"data: " + json.dumps(CHUNK).encode() + b"\n\n"
        chunk = f"{len(event):x}\r\n".encode() + event + b"\r\n"
        first = True
        while True:
            conn.sendall(chunk)
            if first:
                print("streaming", flush=True)
                first = False
            time.sleep(0.02)


def main() -> None:
    port_file, mode = Path(sys.argv[1]), sys.argv[2]
    server = socket.socket()
    server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    port_file.write_text(str(server.getsockname()[1]))
    while True:
        conn, _ = server.accept()
        threading.Thread(target=_serve, args=(conn, mode), daemon=True).start()


if __name__ == "__main__":
    main()
