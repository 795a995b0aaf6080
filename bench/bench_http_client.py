"""What one row's ``/generate`` costs the extractor's CPU: ``httpx.Client.post`` against the plain http.client
connection the request threads now use (``hsextract.extract.requests.plain_post``), on the same body.

A stdlib HTTP/1.1 server in a subprocess answers every POST with a fixed SGLang-shaped answer; this process sends
``--requests`` POSTs of a ``--tokens``-token body on one kept-alive connection per client, the two clients
alternating by repeat, and measures this process's CPU seconds (user + system, ``time.process_time``) per request.
Writes the medians and ``plain_vs_httpx_cpu_ratio`` (below 1: the plain connection costs less).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

import httpx
import orjson

from hsextract.api import PlainConnection

_SERVER = r"""
import http.server, socketserver, sys
ANSWER = b'{"text": "", "meta_info": {"id": "r", "prompt_tokens": 1, "finish_reason": {"type": "length", "length": 0}}}'
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    def do_POST(self):
        self.rfile.read(int(self.headers["Content-Length"]))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(ANSWER)))
        self.end_headers()
        self.wfile.write(ANSWER)
    def log_message(self, *args):
        pass
class Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
server = Server(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def cpu_per_request(post: Callable[[], object], requests: int) -> float:
    post()  # the connection is open before the clock starts
    started = time.process_time()
    for _ in range(requests):
        post()
    return (time.process_time() - started) / requests


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("bench/results-http-client.json"))
    parser.add_argument("--requests", type=int, default=2000, help="POSTs per client and repeat")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=450, help="input_ids in each body (short rows: about 450)")
    args = parser.parse_args()
    server = subprocess.Popen([sys.executable, "-c", _SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        body = {"input_ids": list(range(args.tokens)), "rid": "hsx-000000001-n450", "sampling_params": {"max_new_tokens": 0}}
        encoded = orjson.dumps(body)
        headers = {"Content-Type": "application/json"}
        client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30.0)
        plain = PlainConnection("127.0.0.1", port, 10.0, 30.0, 4.0, lambda: False)
        arms: dict[str, Callable[[], object]] = {
            "httpx": lambda: client.post("/generate", json=body).json(),
            "plain": lambda: json.loads(plain.post("/generate", encoded, headers).content),
        }
        seconds: dict[str, list[float]] = {name: [] for name in arms}
        for repeat in range(args.repeats):
            order = list(arms) if repeat % 2 == 0 else list(reversed(arms))
            for name in order:
                seconds[name].append(cpu_per_request(arms[name], args.requests))
        client.close()
        plain.close()
    finally:
        server.terminate()
        server.wait(10)
    medians = {name: statistics.median(values) for name, values in seconds.items()}
    result = {
        "measured_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "hardware": {"machine": platform.machine(), "cpus": len(os.sched_getaffinity(0)), "host": socket.gethostname()},
        "config": vars(args) | {"out": str(args.out)},
        "cpu_us_per_request": {name: round(value * 1e6, 1) for name, value in medians.items()},
        "cpu_us_per_request_by_repeat": {name: [round(v * 1e6, 1) for v in values] for name, values in seconds.items()},
        "plain_vs_httpx_cpu_ratio": medians["plain"] / medians["httpx"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("cpu_us_per_request", "plain_vs_httpx_cpu_ratio")}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
