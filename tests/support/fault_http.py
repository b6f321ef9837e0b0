"""A misbehaving HTTP origin on 127.0.0.1: real bytes, served with one fault.

``FaultHTTP(files, fault)`` serves ``files`` (``{"/name": bytes}``) from a
thread of the test's process; as a context manager it stops on exit, also
when the test inside it fails.  ``fault`` is one of:

- ``None``: a correct origin (HEAD with Content-Length, ranges answered 206).
- ``"no-length"``: no Content-Length anywhere (HEAD without it, a GET whose
  body ends when the connection closes), ranges ignored (200, whole body).
- ``"gzip"``: ``Content-Encoding: gzip`` on every answer, the length the
  compressed one (fsspec drops such a length: the size reads as unknown).
- ``"from-zero"``: a range answered 206 without a Content-Range, with the
  bytes from offset 0.
- ``"wrong-range"``: a range answered 206 with the bytes and Content-Range of
  the object's start (the range asked is not what came).
- ``"long-206"``: a range answered 206 with its Content-Range but 100 more
  bytes than asked (a Content-Length to match).
- ``"ignore-ranges"``: a range answered 200 with the whole object.
- ``"overlong-body"``: a range answered 206 correctly, then 50 stray bytes
  after the body on the same connection (a body longer than its length).
- ``"forbidden"``: a file whose name starts with ``/forbidden`` answered 403
  (access denied), the others served correctly.

``delay`` (seconds) holds each answer back a random 0 to ``delay`` seconds
(``seed`` draws them): answers then keep arriving while the client is
giving up on the requests it has in flight.

``requests`` counts the GETs served, ``not_modified`` those answered 304 (a
correct origin answers If-None-Match of its ETag so).
"""
from __future__ import annotations

import gzip
import http.server
import random
import re
import socketserver
import threading
import time
import zlib

HOST = "127.0.0.1"


class _Server(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128   # a loader opens tens of connections at once


class FaultHTTP:
    def __init__(self, files, fault=None, delay=0.0, seed=0):
        self.files = dict(files)
        self.fault = fault
        self.delay = float(delay)
        self.rng = random.Random(seed)
        self.requests = 0
        self.heads = 0
        self.not_modified = 0   # GETs answered 304 (If-None-Match of the current ETag)
        self.lock = threading.Lock()
        self.server = None
        self.thread = None
        self.url = None

    def __enter__(self):
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def do_HEAD(self):
                with owner.lock:
                    owner.heads += 1
                self._answer(head=True)

            def do_GET(self):
                with owner.lock:
                    owner.requests += 1
                self._answer(head=False)

            def _answer(self, head):
                if owner.delay:
                    with owner.lock:
                        pause = owner.rng.uniform(0.0, owner.delay)
                    time.sleep(pause)
                name = self.path.split("?", 1)[0]   # a signed query ignored
                if owner.fault == "forbidden" and name.startswith("/forbidden"):
                    self.send_response(403)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = owner.files.get(name)
                if data is None:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                fault = owner.fault
                etag = f'"{zlib.crc32(data):08x}"'   # changes with the bytes
                if fault is None and self.headers.get("If-None-Match") == etag:
                    with owner.lock:
                        owner.not_modified += 1
                    self.send_response(304)
                    self.send_header("ETag", etag)
                    self.end_headers()
                    return
                rng = self.headers.get("Range")
                m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng or "")
                if fault == "no-length":
                    self.protocol_version = "HTTP/1.0"   # the body ends with the connection
                    self.send_response(200)
                    self.send_header("ETag", etag)
                    self.send_header("Connection", "close")
                    self.end_headers()
                    if not head:
                        self.wfile.write(data)
                    self.close_connection = True
                    return
                if fault == "gzip":
                    body = gzip.compress(data)
                    self.send_response(200)
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(body)))
                    self.send_header("ETag", etag)
                    self.end_headers()
                    if not head:
                        self.wfile.write(body)
                    return
                if m is None or head or fault == "ignore-ranges":
                    self.send_response(200)
                    self.send_header("Content-Length", str(len(data)))
                    self.send_header("Accept-Ranges", "bytes")
                    self.send_header("ETag", etag)
                    self.end_headers()
                    if not head:
                        self.wfile.write(data)
                    return
                lo = int(m.group(1))
                hi = int(m.group(2)) + 1 if m.group(2) else len(data)
                hi = min(hi, len(data))
                body, shown = data[lo:hi], (lo, hi)
                if fault == "from-zero":
                    body = data[:hi - lo]
                elif fault == "wrong-range":
                    body, shown = data[:hi - lo], (0, hi - lo)
                elif fault == "long-206":
                    body = data[lo:hi] + b"\xee" * 100
                if fault == "overlong-body":
                    # Headers, body and the stray bytes in one write: they
                    # reach the client together.
                    self.wfile.write(
                        f"HTTP/1.1 206 Partial Content\r\nContent-Range: bytes {lo}-{hi - 1}/"
                        f"{len(data)}\r\nContent-Length: {len(body)}\r\nETag: {etag}\r\n"
                        f"\r\n".encode() + body + b"\xee" * 50)
                    self.close_connection = True
                    return
                self.send_response(206)
                if fault != "from-zero":
                    self.send_header("Content-Range",
                                     f"bytes {shown[0]}-{shown[1] - 1}/{len(data)}")
                self.send_header("Content-Length", str(len(body)))
                self.send_header("ETag", etag)
                self.end_headers()
                self.wfile.write(body)

        self.server = _Server((HOST, 0), Handler)
        self.url = f"http://{HOST}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever,
                                       kwargs={"poll_interval": 0.05}, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        if self.server is not None:
            self.server.shutdown()
            self.server.server_close()
            self.thread.join(10)
            self.server = None
