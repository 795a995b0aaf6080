"""A server whose model never finishes loading: GET /health answers 200, /health_generate 503.

The stimulus of test_lxc_incidents.py's health replay (SGLang answers /health before it can run a forward);
it runs in the container as hsextract-server.service under the ml-env's interpreter. Standard library only.
usage: python half_ready_server.py PORT
"""

from __future__ import annotations

import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        status = 200 if path == "/health" else 503
        body = b"" if status == 200 else b'{"error": {"message": "model weights still loading"}}'
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        status = "200" if self.path.split("?", 1)[0] == "/health" else "503, model weights still loading"
        print(f"GET {self.path} -> {status}", file=sys.stderr, flush=True)


if __name__ == "__main__":
    print("loading model weights (this stand-in never finishes)", file=sys.stderr, flush=True)
    ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), Handler).serve_forever()
