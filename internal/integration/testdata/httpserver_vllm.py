#!/usr/bin/env python3
"""A vLLM stand-in served the way Python's http.server serves: for the
readiness benchmark (BenchmarkReadinessLikeAPlainClient).

It writes uvicorn's three startup lines to stderr in one write, listens right
after, and answers /health, /v1/models and a 1-token /v1/completions with
HTTP/1.0, the status line and headers in one write and the body in another
(http.server's way; Nagle is left on, as http.server leaves it). Each answer
takes a fixed time, about 17 ms for the three.

STANDIN_LISTEN_FILE: a line "listen <unix seconds>" is appended when it
listens, and "answered <unix seconds>" for its first completion (when it
began writing it; the line is written after the answer).
STANDIN_EXIT_AFTER: seconds after the first completion at which it exits 1
(the guard then starts it again); unset: it runs until killed.
"""

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer

DELAY = {"/health": 0.002, "/v1/models": 0.003, "/v1/completions": 0.012}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.0"
    server_version = "uvicorn"
    sys_version = ""

    def log_message(self, fmt, *args):
        host, port = self.client_address[:2]
        line = 'INFO:     %s:%d - "%s" %s\n' % (host, port, self.requestline, args[1] if len(args) > 1 else "-")
        os.write(2, line.encode())

    def answer(self, code, obj):
        time.sleep(DELAY.get(self.path, 0))
        body = b"" if obj is None else json.dumps(obj).encode()
        self.server.sent = time.time()
        self.send_response(code)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()  # one write: status line and headers
        if body:
            self.wfile.write(body)  # another: the body

    def do_GET(self):
        if self.path == "/health":
            self.answer(200, None)
        elif self.path == "/v1/models":
            self.answer(200, {"object": "list", "data": [
                {"id": self.server.model, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                 "root": self.server.model, "max_model_len": 4096}]})
        else:
            self.answer(404, {"detail": "Not Found"})

    def do_POST(self):
        n = int(self.headers.get("content-length") or 0)
        req = json.loads(self.rfile.read(n) or b"{}")
        if self.path != "/v1/completions":
            self.answer(404, {"detail": "Not Found"})
            return
        self.answer(200, {
            "id": "cmpl-standin", "object": "text_completion", "created": int(time.time()),
            "model": req.get("model", self.server.model),
            "choices": [{"index": 0, "text": "x", "logprobs": None, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
        if self.server.answered:
            return
        self.server.answered = True
        note("answered", self.server.sent)
        after = os.environ.get("STANDIN_EXIT_AFTER")
        if after:
            threading.Timer(float(after), lambda: os._exit(1)).start()


def note(what, at=None):
    if os.environ.get("STANDIN_LISTEN_FILE"):
        with open(os.environ["STANDIN_LISTEN_FILE"], "a") as f:
            f.write("%s %.6f\n" % (what, time.time() if at is None else at))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("cmd", nargs="?")
    p.add_argument("model", nargs="?", default="test-model")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    a, _ = p.parse_known_args()
    os.write(2, ("INFO:     Started server process [%d]\nINFO:     Waiting for application startup.\n"
                 "INFO:     Application startup complete.\n" % os.getpid()).encode())
    srv = HTTPServer((a.host, a.port), Handler)  # binds and listens
    note("listen")
    srv.model, srv.answered = a.model, False
    os.write(2, ("INFO:     Uvicorn running on http://%s:%d (Press CTRL+C to quit)\n" % (a.host, a.port)).encode())
    srv.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
