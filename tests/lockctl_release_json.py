#!/usr/bin/env python3
"""issue 17 finding 14: lockctl --json release prints valid JSON whatever bytes lockd's admin
socket replies with (quotes, backslashes, control bytes, invalid UTF-8). A fake admin socket
answers; lockctl's output is parsed by json. Usage: lockctl_release_json.py LOCKCTL"""
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading

REPLY = b'ok fenced session 3 "q\\" \\\\ \x01\x1f\x7f \x80 \xc0\xaf \xed\xa0\x80 \xff \xc3\xa9\n'

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "admin.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(1)

    def serve():
        conn, _ = srv.accept()
        conn.recv(4096)
        conn.sendall(REPLY)
        conn.close()

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    out = subprocess.run([sys.argv[1], "--json", "release", "--force", "--session", "3",
                          "--admin-socket", path], capture_output=True, timeout=20)
    t.join(5)
print("lockctl exit", out.returncode, "output", repr(out.stdout))
try:
    doc = json.loads(out.stdout.decode("utf-8"))
except (UnicodeDecodeError, ValueError) as e:
    print("not JSON:", e)
    sys.exit(1)
assert doc["ok"] is True, doc
assert doc["reply"].startswith('fenced session 3 "q\\" \\\\ \x01\x1f\x7f \ufffd'), doc
assert doc["reply"].endswith("\ufffd \xe9"), doc
print("release-json-ok")
