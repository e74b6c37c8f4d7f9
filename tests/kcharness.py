"""kcharness.py: the one way the Python suites start a real kcached.

Used by tests/test_resp.py, test_resp_attack.py, test_service.py,
test_page.py (unittest or plain scripts, run from tests/) and by
tests/python/ (pytest: conftest.py, test_torch.py) and the torch bench.

- Kcached: kcached over a temporary LMDB store (data_dir/data), HTTP on a
  free loopback port (--port-file) and, unless resp=False, RESP
  (--resp-listen) on another free port, optionally with a token file;
  start() retries when a free port was taken meanwhile; stop() fails on a
  sanitizer report in its log (and, with want_rc, on another exit status);
  cleanup() stops it and removes data_dir. Whatever goes wrong carries the
  tail of kcached's log.
- ServerCase: one Kcached per unittest class (FLAGS), its log printed when
  one of the class's tests failed.
- need(): the rule for a missing dependency, as the C suites have it:
  skipped (exit 77 or a skipped test), but a failure when CI=true.
- Small shared helpers: free_port, make_tokens, metric (Prometheus text),
  raw / read_exactly (sockets), rss_anon_kib, FakeS3 (a stand-in bucket).

The kcached binary: KCACHED here (the suites set it from their argument),
else $KCACHED, else build/server/kcached or build-san/server/kcached.
"""

import http.server
import importlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
KCACHED = None
LOG_TAIL = 3000
SANITIZER_MARKS = ("AddressSanitizer", "LeakSanitizer", "runtime error:")


# ---- a missing dependency: skipped, or a failure when CI=true ----


def in_ci():
    return os.environ.get("CI") == "true"


def missing(what, exit_code=77):
    """A dependency the whole suite needs is missing: exits 77 (ctest's
    SKIP_RETURN_CODE), or 1 with the reason when CI=true (CI installs
    everything: a skip there would hide a test that never ran)."""
    prog = os.path.basename(sys.argv[0])
    if in_ci():
        print(
            "%s: FAIL: %s (required when CI=true; scripts/install-deps.sh "
            "installs it)" % (prog, what),
            file=sys.stderr,
        )
        sys.exit(1)
    print("%s: %s: skipped" % (prog, what))
    sys.exit(exit_code)


def need(module, package=None):
    """Imports module for a whole suite, or missing() without it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        missing("%s is not installed (%s)" % (package or module, e))


def skip_or_fail(case, what):
    """One unittest test lacks a dependency: skipped, failed when CI=true."""
    if in_ci():
        case.fail("%s (required when CI=true)" % what)
    case.skipTest(what)


# ---- kcached ----


def kcached_path():
    if KCACHED:
        return KCACHED
    p = os.environ.get("KCACHED")
    if p:
        return p
    for b in ("build", "build-san"):
        c = os.path.join(ROOT, b, "server", "kcached")
        if os.path.exists(c):
            return c
    raise RuntimeError("kcached not built (set KCACHED)")


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


TOKEN_NAMES = {"read": "reader", "write": "writer", "admin": "admin"}


def make_tokens(d, roles=("read", "write", "admin"), names=None):
    """A token file in d with one token per role (named TOKEN_NAMES[role]
    unless names says otherwise); ({role: token}, path)."""
    names = names or TOKEN_NAMES
    toks, lines = {}, []
    for role in roles:
        out = subprocess.run(
            [kcached_path(), "token", role, names[role]],
            capture_output=True,
            check=True,
            text=True,
        )
        body = [x for x in out.stdout.splitlines() if not x.startswith("#")]
        toks[role] = body[0].strip()
        lines.append(body[1].strip())
    path = os.path.join(d, "tokens")
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, 0o600)
    return toks, path


class Kcached:
    """A kcached on loopback over data_dir (a fresh temporary directory
    unless given). port is the RESP port (None with resp=False), url the
    HTTP one's base URL; tokens={role: token} with tokens=True."""

    def __init__(
        self,
        *extra,
        data_dir=None,
        resp=True,
        tokens=False,
        anonymous_role=None,
        threads=None,
        prefix="kc-",
    ):
        self.dir = data_dir or tempfile.mkdtemp(prefix=prefix)
        os.makedirs(self.dir, exist_ok=True)
        self.extra = list(extra)
        self.resp = resp
        self.tokens = {}
        if tokens:
            self.tokens, path = make_tokens(self.dir)
            self.extra += ["--tokens", path]
            if anonymous_role:
                self.extra += ["--resp-anonymous-role", anonymous_role]
        if threads:
            self.extra += ["--threads", str(threads)]
        self.port_file = os.path.join(self.dir, "http-port")
        self.log_path = os.path.join(self.dir, "kcached.log")
        self.proc = None
        self.port = None
        self._http_port = None
        self.log = None

    # the names the suites grew up with
    @property
    def resp_port(self):
        return self.port

    @property
    def resp_url(self):
        return "redis://127.0.0.1:%d" % self.port

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.http_port()

    def http_port(self):
        if self._http_port is None:
            with open(self.port_file) as f:
                self._http_port = int(f.read())
        return self._http_port

    def start(self, timeout=20):
        for _ in range(5):  # a free port may be taken meanwhile: retry
            if os.path.exists(self.port_file):
                os.unlink(self.port_file)
            self._http_port = None
            cmd = [
                kcached_path(),
                "--listen",
                "127.0.0.1:0",
                "--port-file",
                self.port_file,
                "--data-dir",
                os.path.join(self.dir, "data"),
            ]
            if self.resp:
                self.port = free_port()
                cmd += ["--resp-listen", "127.0.0.1:%d" % self.port]
            self.log = open(self.log_path, "ab")
            self.proc = subprocess.Popen(
                cmd + self.extra, stdout=self.log, stderr=self.log
            )
            if self._wait(timeout):
                return self
            self._kill()
        raise RuntimeError(
            "kcached did not start (%s):\n%s"
            % (" ".join(cmd + self.extra), self.log_tail())
        )

    def _up(self):
        try:
            self.http_port()
        except (OSError, ValueError):
            self._http_port = None
            return False
        if not self.resp:
            return True
        try:
            socket.create_connection(("127.0.0.1", self.port), 0.2).close()
            return True
        except OSError:
            return False

    def _wait(self, timeout):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.proc.poll() is not None:
                return False
            if self._up():
                return True
            time.sleep(0.05)
        return False

    def _kill(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if self.log:
            self.log.close()

    def stop(self, sig=signal.SIGTERM, want_rc=None, timeout=30):
        """Sends sig and waits; fails on a sanitizer report in the log, when
        kcached outlives timeout (then it is killed), or, with want_rc, on
        another exit status. Returns the exit status."""
        rc = None
        if self.proc:
            if self.proc.poll() is None:
                self.proc.send_signal(sig)
                try:
                    self.proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    self._kill()
                    raise AssertionError(
                        "kcached did not stop in %d s after signal %d:\n%s"
                        % (timeout, sig, self.log_tail())
                    )
            rc = self.proc.returncode
        if self.log:
            self.log.close()
        text = self.log_text()
        for bad in SANITIZER_MARKS:
            if bad in text:  # a sanitizer build reports into the log
                raise AssertionError(
                    "kcached: %s in %s:\n%s"
                    % (bad, self.dir, text[-LOG_TAIL:])
                )
        if want_rc is not None and rc != want_rc:
            raise AssertionError(
                "kcached exited %s, not %d:\n%s"
                % (rc, want_rc, self.log_tail())
            )
        return rc

    def cleanup(self):
        try:
            self.stop()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def log_text(self):
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    access_log = log_text

    def log_tail(self):
        return "--- %s (tail) ---\n%s" % (
            self.log_path,
            self.log_text()[-LOG_TAIL:],
        )

    def metrics(self):
        import urllib.request

        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return r.read().decode()

    def stats(self, token=None):
        import json
        import urllib.request

        req = urllib.request.Request(self.url + "/v1/stats")
        if token:
            req.add_header("Authorization", "Bearer " + token)
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)

    def client(self, **kw):
        """A redis-py client of the RESP port."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, **kw)


class ServerCase(unittest.TestCase):
    """One kcached started with FLAGS for the whole class (self.srv); its
    data directory is removed afterwards, and its log's tail printed when
    one of the class's tests failed."""

    FLAGS = ()

    @classmethod
    def setUpClass(cls):
        cls.srv = Kcached(*cls.FLAGS, prefix="kc-test-").start()

    @classmethod
    def tearDownClass(cls):
        try:
            cls.srv.stop()
        finally:
            shutil.rmtree(cls.srv.dir, ignore_errors=True)

    def run(self, result=None):
        bad = (len(result.failures) + len(result.errors)) if result else 0
        out = super().run(result)
        if result and len(result.failures) + len(result.errors) > bad:
            print("\n%s" % self.srv.log_tail(), file=sys.stderr)
        return out


# ---- helpers the suites share ----


def metric(text, name, labels=""):
    """The value of one sample of a Prometheus text, None if absent."""
    want = name + ("{%s}" % labels if labels else "")
    for line in text.splitlines():
        if line.split(" ")[0] == want:
            return float(line.split()[-1])
    return None


def raw(port, data, expect=None):
    """Sends data on a fresh socket; what comes back until EOF (b'<EOF>'
    appended) or a quiet moment: 50 ms once `expect`'s length arrived, else
    half a second."""
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(data)
    out = b""
    try:
        while True:
            enough = expect is not None and len(out) >= len(expect) - 5
            s.settimeout(0.05 if enough else (5 if expect else 0.5))
            d = s.recv(1 << 20)
            if not d:
                out += b"<EOF>"
                break
            out += d
    except socket.timeout:
        pass
    finally:
        s.close()
    return out


def read_exactly(s, n, timeout=10):
    """Reads n bytes from s; fewer when it waits more than timeout."""
    s.settimeout(timeout)
    out = bytearray()
    try:
        while len(out) < n:
            d = s.recv(min(1 << 20, n - len(out)))
            if not d:
                break
            out += d
    except socket.timeout:
        pass
    return bytes(out)


def rss_anon_kib(pid, field="RssAnon:"):
    """field's value (KiB) in /proc/PID/status; raises when it is absent
    (a 0 would let memory bounds pass without measuring)."""
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(field):
                return int(line.split()[1])
    raise AssertionError("no %s in /proc/%d/status" % (field, pid))


class FakeS3(http.server.BaseHTTPRequestHandler):
    """A stand-in bucket: answers every object read with 404 after a second
    (and records it), takes every write: enough to see a read-through asked
    without the listener waiting for it."""

    gets = []

    def log_message(self, *a):
        pass

    def _empty(self, code):
        self.send_response(code)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self):
        FakeS3.gets.append(self.path)
        if "/kv" in self.path:
            time.sleep(1.0)
        body = b"<Error><Code>NoSuchKey</Code></Error>"
        self.send_response(404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_HEAD(self):
        self._empty(404)

    def do_PUT(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("ETag", '"x"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_DELETE(self):
        self._empty(204)


def main_with_kcached(doc):
    """unittest's main for a suite run as SUITE.py KCACHED [unittest args]."""
    global KCACHED
    if len(sys.argv) < 2:
        print(doc)
        sys.exit(2)
    KCACHED = os.path.abspath(sys.argv.pop(1))
    unittest.main(verbosity=2)
