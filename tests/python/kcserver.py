"""kcserver.py: a real kcached for the Python tests and the torch bench: a
temporary LMDB store, HTTP on a free loopback port (--port-file) and RESP
(--resp-listen) on another, optionally with a token file (read and write
tokens). Also runs torch_worker.py processes.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "torch_worker.py")


def kcached_path():
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


class Kcached:
    def __init__(self, tokens=False, anonymous_role=None):
        self.dir = tempfile.mkdtemp(prefix="kc-py-")
        self.tokens = {}
        self.extra = []
        if tokens:
            lines = []
            for role in ("read", "write", "admin"):
                out = subprocess.run([kcached_path(), "token", role, role],
                                     capture_output=True, text=True,
                                     check=True).stdout.splitlines()
                body = [x for x in out if not x.startswith("#")]
                self.tokens[role] = body[0].strip()
                lines.append(body[1].strip())
            tf = os.path.join(self.dir, "tokens")
            with open(tf, "w") as f:
                f.write("\n".join(lines) + "\n")
            os.chmod(tf, 0o600)
            self.extra += ["--tokens", tf]
            if anonymous_role:
                self.extra += ["--resp-anonymous-role", anonymous_role]
        self.proc = None

    def start(self):
        for _ in range(5):
            self.resp_port = free_port()
            pf = os.path.join(self.dir, "http-port")
            if os.path.exists(pf):
                os.unlink(pf)
            self.log = open(os.path.join(self.dir, "kcached.log"), "ab")
            self.proc = subprocess.Popen(
                [kcached_path(), "--listen", "127.0.0.1:0", "--port-file", pf,
                 "--data-dir", os.path.join(self.dir, "data"),
                 "--resp-listen", "127.0.0.1:%d" % self.resp_port,
                 "--threads", "4"] + self.extra,
                stdout=self.log, stderr=self.log)
            deadline = time.time() + 15
            while time.time() < deadline and self.proc.poll() is None:
                if os.path.exists(pf) and self._resp_up():
                    with open(pf) as f:
                        self.port = int(f.read().strip())
                    self.url = "http://127.0.0.1:%d" % self.port
                    self.resp_url = "redis://127.0.0.1:%d" % self.resp_port
                    return self
                time.sleep(0.05)
            self.stop()
        raise RuntimeError("kcached did not start; see " + self.dir)

    def _resp_up(self):
        try:
            socket.create_connection(("127.0.0.1", self.resp_port), 0.2).close()
            return True
        except OSError:
            return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def cleanup(self):
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def stats(self, token=None):
        req = urllib.request.Request(self.url + "/v1/stats")
        if token:
            req.add_header("Authorization", "Bearer " + token)
        with urllib.request.urlopen(req, timeout=5) as r:
            return json.load(r)

    def access_log(self):
        with open(os.path.join(self.dir, "kcached.log"), "rb") as f:
            return f.read().decode("utf-8", "replace")


def run_worker(path, env_extra, args=(), python=None, timeout=600,
               check=True):
    """Runs torch_worker.py in a fresh process; returns its RESULT dict."""
    env = dict(os.environ)
    env.update(env_extra)
    env["KCACHE_T0"] = repr(time.time())
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    p = subprocess.run([python or sys.executable, WORKER, "--path", path] +
                       list(args), env=env, capture_output=True, text=True,
                       timeout=timeout)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["stderr"] = p.stderr[-4000:]
            return r
    if check:
        raise AssertionError("worker failed (rc %d):\n%s\n%s" %
                             (p.returncode, p.stdout[-3000:],
                              p.stderr[-6000:]))
    return None
