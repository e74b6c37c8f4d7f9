#!/usr/bin/env python3
"""test_service.py: the service layer both front ends share (server/
service.c): kcached_ops_total counts an operation under the same op label
whichever front end served it (HTTP GET of a blob, RESP GET of a key: both
op="get"), and graceful shutdown (SIGTERM) waits for a RESP command in
flight as it does for an HTTP request. A real kcached on free loopback
ports over a temporary LMDB store (kcharness.py).

usage: test_service.py KCACHED [unittest args]
(exit 77: redis-py missing; a failure instead when CI=true)
"""

import hashlib
import http.server
import json
import os
import re
import shutil
import signal
import socket
import tempfile
import threading
import time
import unittest
import urllib.error
import urllib.request

import kcharness
from kcharness import FakeS3, Kcached as Server, ServerCase, make_tokens

redis = kcharness.need("redis", "python3-redis")


def call(srv, method, path, body=None, token=None):
    """(status, body) of one request to srv's HTTP port."""
    req = urllib.request.Request(
        "http://127.0.0.1:%d%s" % (srv.http_port(), path),
        data=body,
        method=method,
    )
    if body is not None:
        req.add_header("Content-Type", "application/json")
    if token is not None:
        req.add_header("Authorization", token)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


OPS = re.compile(
    r'^kcached_ops_total\{op="([a-z_]+)",frontend="([a-z]+)",'
    r'result="([a-z]+)"\} (\d+)$',
    re.M,
)


def ops(srv):
    """{(op, frontend, result): count} from /metrics."""
    return {
        (o, fe, res): int(n) for o, fe, res, n in OPS.findall(srv.metrics())
    }


class OpsMetric(ServerCase):
    """No token file: every operation allowed (loopback only)."""

    def delta(self, before, **want):
        after = ops(self.srv)
        for k, n in want.items():
            key = tuple(k.split("__"))
            self.assertEqual(
                after.get(key, 0) - before.get(key, 0),
                n,
                "%s: %r" % (k, after),
            )

    def test_get_hit_and_miss_on_both_front_ends(self):
        before = ops(self.srv)
        # every op the front end serves is listed before it happened
        for res in ("hit", "miss", "error"):
            self.assertIn(("get", "http", res), before)
            self.assertIn(("get", "resp", res), before)
        self.assertNotIn(("lease_take", "resp", "granted"), before)
        data = b"a blob for the op metric"
        d = hashlib.sha256(data).hexdigest()
        self.assertEqual(call(self.srv, "PUT", "/v1/blobs/" + d, data)[0], 201)
        self.assertEqual(call(self.srv, "GET", "/v1/blobs/" + d), (200, data))
        self.assertEqual(call(self.srv, "HEAD", "/v1/blobs/" + d)[0], 200)
        self.assertEqual(
            call(self.srv, "GET", "/v1/blobs/" + "0" * 64)[0], 404
        )
        self.assertEqual(
            call(self.srv, "GET", "/v1/bundles/" + "1" * 64)[0], 404
        )
        r = self.srv.client()
        r.set("svc:k", "v")
        self.assertEqual(r.get("svc:k"), b"v")
        self.assertIsNone(r.get("svc:nope"))
        self.assertEqual(r.mget("svc:k", "svc:gone"), [b"v", None])
        r.close()
        self.delta(
            before,
            get__http__hit=2,
            get__http__miss=2,
            get__http__error=0,
            get__resp__hit=2,
            get__resp__miss=2,
            get__resp__error=0,
            put__http__new=1,
        )
        # the same offer again: held already, the body is skipped
        before = ops(self.srv)
        self.assertEqual(call(self.srv, "PUT", "/v1/blobs/" + d, data)[0], 200)
        self.delta(before, put__http__present=1, put__http__new=0)

    def test_set_on_resp(self):
        """RESP writes count as op="set" (HTTP bundle PUTs: test_server_bundle):
        written (new), held already with no commit (present), refused by NX
        or XX (refused)."""
        before = ops(self.srv)
        self.assertIn(("set", "resp", "new"), before)
        r = self.srv.client()
        self.assertTrue(r.set("svc:set", b"one"))
        self.assertTrue(r.set("svc:set", b"one"))  # held: settled, no commit
        self.assertIsNone(r.set("svc:set", b"two", nx=True))
        self.assertIsNone(r.set("svc:absent", b"x", xx=True))
        self.assertTrue(r.mset({"svc:m1": b"a", "svc:m2": b"b"}))
        r.close()
        self.delta(
            before,
            set__resp__new=3,
            set__resp__present=1,
            set__resp__refused=2,
            set__resp__error=0,
        )

    def test_leases_and_lookups(self):
        before = ops(self.srv)
        key = hashlib.sha256(b"svc lease").hexdigest()
        st, body = call(self.srv, "POST", "/v1/leases/" + key, b"")
        self.assertEqual(st, 201)
        tok = json.loads(body)["lease"]
        self.assertEqual(
            call(self.srv, "POST", "/v1/leases/" + key, b"")[0], 409
        )
        self.assertEqual(
            call(
                self.srv, "DELETE", "/v1/leases/%s?lease=%s" % (key, "f" * 32)
            )[0],
            403,
        )
        self.assertEqual(
            call(self.srv, "DELETE", "/v1/leases/%s?lease=%s" % (key, tok))[0],
            204,
        )
        self.assertEqual(
            call(self.srv, "DELETE", "/v1/leases/%s?lease=%s" % (key, tok))[0],
            404,
        )
        st, body = call(
            self.srv,
            "POST",
            "/v1/lookup",
            json.dumps({"keys": [key, "2" * 64]}).encode(),
        )
        self.assertEqual(st, 200)
        self.assertEqual(json.loads(body)["missing"], sorted([key, "2" * 64]))
        self.delta(
            before,
            lease_take__http__granted=1,
            lease_take__http__held=1,
            lease_release__http__denied=1,
            lease_release__http__ok=1,
            lease_release__http__miss=1,
            lookup__http__miss=2,
            lookup__http__hit=0,
        )

    def gauges(self):
        """(http ops, resp ops, requests) in flight, as /metrics reads them
        (the /metrics request itself among them)."""
        text = self.srv.metrics()

        def one(pat):
            m = re.search(pat + r" (-?\d+)$", text, re.M)
            self.assertIsNotNone(m, pat)
            return int(m.group(1))

        return (
            one(r'kcached_ops_in_flight\{frontend="http"\}'),
            one(r'kcached_ops_in_flight\{frontend="resp"\}'),
            one("kcached_requests_in_flight"),
        )

    def settle(self, want, seconds=10):
        """The gauges once they read want. A request ends (the gauge goes
        down) in libmicrohttpd's completion callback, which may run just
        after its client has the answer and has sent the next request: an
        earlier test's last request can still be counted for a moment."""
        deadline = time.monotonic() + seconds
        got = self.gauges()
        while got != want and time.monotonic() < deadline:
            time.sleep(0.02)
            got = self.gauges()
        return got

    def test_in_flight_gauge(self):
        # alone, the /metrics request is the one HTTP operation in flight
        self.assertEqual(self.settle((1, 0, 1)), (1, 0, 1))
        # an upload whose body has not all come is one more, until it ends
        d = hashlib.sha256(b"held").hexdigest()
        s = socket.create_connection(
            ("127.0.0.1", self.srv.http_port()), timeout=10
        )
        try:
            s.sendall(
                b"PUT /v1/blobs/%s HTTP/1.1\r\nHost: localhost\r\n"
                b"Content-Length: 4\r\n\r\nhe" % d.encode()
            )
            self.assertEqual(self.settle((2, 0, 2)), (2, 0, 2))
            s.sendall(b"ld")
            self.assertTrue(s.recv(4096).startswith(b"HTTP/1.1 201"))
        finally:
            s.close()
        self.assertEqual(self.settle((1, 0, 1)), (1, 0, 1))


class AuthOnBothFrontEnds(unittest.TestCase):
    """One token check (service.c) behind HTTP's Bearer and RESP's AUTH."""

    def test_auth_counted_under_one_op(self):
        d = tempfile.mkdtemp(prefix="kc-svc-")
        toks, path = make_tokens(d)
        srv = Server(
            "--tokens", path, "--metrics-role", "none", data_dir=d
        ).start()
        try:
            before = ops(srv)
            blob = "/v1/blobs/" + "3" * 64
            self.assertEqual(call(srv, "GET", blob)[0], 401)  # none offered
            self.assertEqual(
                call(srv, "GET", blob, token="Bearer nope")[0], 401
            )
            self.assertEqual(call(srv, "GET", blob, token="Basic xyz")[0], 401)
            self.assertEqual(call(srv, "GET", blob, token="Bearer ")[0], 401)
            self.assertEqual(
                call(srv, "GET", blob, token="Bearer " + toks["read"])[0], 404
            )
            r = srv.client()
            with self.assertRaises(
                (
                    redis.exceptions.ResponseError,
                    redis.exceptions.AuthenticationError,
                )
            ):
                r.execute_command("AUTH", "nope")
            with self.assertRaises(
                (
                    redis.exceptions.ResponseError,
                    redis.exceptions.AuthenticationError,
                )
            ):
                r.execute_command("AUTH", "")
            with self.assertRaises(
                (
                    redis.exceptions.ResponseError,
                    redis.exceptions.AuthenticationError,
                )
            ):
                r.execute_command("AUTH", "writer", toks["read"])
            self.assertTrue(r.execute_command("AUTH", "reader", toks["read"]))
            self.assertIsNone(r.get("svc:none"))
            r.close()
            after = ops(srv)

            def n(*k):
                return after.get(k, 0) - before.get(k, 0)

            self.assertEqual(n("auth", "http", "denied"), 3)
            self.assertEqual(n("auth", "http", "ok"), 1)
            self.assertEqual(n("auth", "resp", "denied"), 3)
            self.assertEqual(n("auth", "resp", "ok"), 1)
            self.assertEqual(n("get", "http", "miss"), 1)
            self.assertEqual(n("get", "resp", "miss"), 1)
        finally:
            srv.stop()
            shutil.rmtree(d, ignore_errors=True)


class GracefulShutdown(unittest.TestCase):
    """SIGTERM: no new connection on either port; a RESP GET waiting for
    the durable tier (the fake S3 answers a key's read after a second) is
    answered before kcached exits, as an HTTP request in flight is."""

    def test_sigterm_waits_for_resp_read_through(self):
        s3 = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeS3)
        threading.Thread(target=s3.serve_forever, daemon=True).start()
        d = tempfile.mkdtemp(prefix="kc-svc-")
        old = os.environ.copy()
        os.environ.update(AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b")
        try:  # the environment kcached starts with; ours again after
            srv = Server(
                "--s3-endpoint",
                "http://127.0.0.1:%d" % s3.server_address[1],
                "--s3-bucket",
                "bkt",
                "--s3-path-style",
                "--shutdown-timeout",
                "10",
                data_dir=d,
            ).start()
        finally:
            os.environ.clear()
            os.environ.update(old)
        try:
            r = srv.client()
            self.assertTrue(r.ping())
            got = {}

            def slow():
                t = time.time()
                try:
                    got["value"] = r.get("svc:in-s3?")
                except Exception as e:  # noqa: BLE001 (the failure shown)
                    got["error"] = repr(e)
                got["secs"] = time.time() - t

            t = threading.Thread(target=slow)
            t.start()
            time.sleep(0.3)  # the GET waits on the fetcher now
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)
            with self.assertRaises(OSError):  # quiesced: no new client
                socket.create_connection(("127.0.0.1", srv.port), 1).close()
            with self.assertRaises(OSError):  # HTTP: closed unserved
                call(srv, "GET", "/healthz")
            t.join(15)
            self.assertNotIn("error", got)
            self.assertIsNone(got["value"])  # the bucket lacks it: a miss
            self.assertGreaterEqual(got["secs"], 0.9)
            self.assertEqual(srv.proc.wait(15), 0)
            r.close()
        finally:
            srv.stop()
            s3.shutdown()
            s3.server_close()
            with open(os.path.join(d, "kcached.log"), "rb") as f:
                log = f.read().decode(errors="replace")
            shutil.rmtree(d, ignore_errors=True)
        self.assertNotIn("cutting off", log)

    def test_sigterm_finishes_a_reply_being_sent(self):
        """A GET answered at once (no fetch: nothing in flight) whose 48 MiB
        reply the client has not read yet: SIGTERM lets it go out whole
        before kcached exits (it used to be cut where the socket's buffers
        ended)."""
        d = tempfile.mkdtemp(prefix="kc-svc-")
        srv = Server("--shutdown-timeout", "20", data_dir=d).start()
        val = os.urandom(48 << 20)
        want = b"$%d\r\n" % len(val) + val + b"\r\n"
        try:
            r = srv.client()
            self.assertTrue(r.set("big", val))
            r.close()
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
            s.settimeout(20)
            s.connect(("127.0.0.1", srv.port))
            s.sendall(b"*2\r\n$3\r\nGET\r\n$3\r\nbig\r\n")
            time.sleep(0.5)  # the reply waits in kcached, mostly unsent
            srv.proc.send_signal(signal.SIGTERM)
            time.sleep(0.5)
            got = bytearray()
            while len(got) < len(want):
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                got += chunk
            s.close()
            self.assertEqual(len(got), len(want))
            self.assertTrue(bytes(got) == want, "the reply's bytes differ")
            self.assertEqual(srv.proc.wait(15), 0)
        finally:
            srv.stop()
            with open(os.path.join(d, "kcached.log"), "rb") as f:
                log = f.read().decode(errors="replace")
            shutil.rmtree(d, ignore_errors=True)
        self.assertNotIn("cutting off", log)


if __name__ == "__main__":
    kcharness.main_with_kcached(__doc__)
