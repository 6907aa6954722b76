#!/usr/bin/env python3
"""An HTTP proxy in front of a test's etcd that forwards every request but fails (503) the prefix
reads (/v3/kv/range with a range_end) whose key ends with SUFFIX: an etcd member that cannot
confirm a read, for one kind of read only.
  etcd_fail_proxy.py UPSTREAM_URL SUFFIX
Prints the URL it listens on (127.0.0.1, a free port), then serves until killed."""
import base64
import http.server
import json
import sys
import urllib.error
import urllib.request

upstream, suffix = sys.argv[1], sys.argv[2]


class Proxy(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        if self.path == "/v3/kv/range":
            req = json.loads(body or b"{}")
            key = base64.b64decode(req.get("key", "")).decode("utf-8", "replace")
            if "range_end" in req and key.endswith(suffix):
                self.send_response(503)
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
        fwd = urllib.request.Request(upstream + self.path, data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(fwd, timeout=5) as r:
                status, data = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, data = e.code, e.read()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
print("http://127.0.0.1:%d" % server.server_address[1], flush=True)
server.serve_forever()
