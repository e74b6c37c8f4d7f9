#!/usr/bin/env python3
"""test_resp_attack.py: attacks on kcached's Redis protocol port, each as a
hostile client sends it, against a real kcached (kcharness.py):

- an HTTP request sent to the RESP port (a web page's no-cors POST) runs
  nothing and is closed; first bytes that are not RESP are refused;
- a token removed or changed by SIGHUP stops working on open connections;
- --resp-timeout closes idle connections;
- a command of many arguments leaves no big tables behind; the argument cap;
- replies no one reads, and MGET of a big key repeated, stay within
  --resp-output-limit and --resp-output-total; --resp-output-stall;
- --resp-max-connections and --resp-max-connections-per-ip;
- KEYS and SCAN MATCH patterns of too many '*' runs;
- a blob just uploaded over HTTP for a manifest still to come, then SET
  and DEL (or evicted) under a RESP key of the same bytes, is kept.

usage: test_resp_attack.py KCACHED [unittest args]
(exit 77: no redis-py; a failure instead when CI=true)"""

import os
import shutil
import signal
import socket
import tempfile
import time
import unittest

import kcharness as tr

redis = tr.need("redis", "python3-redis")


def connect(port, src="127.0.0.1"):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((src, 0))
    s.connect(("127.0.0.1", port))
    return s


def read_to_eof(s, timeout=5):
    """Everything until the peer closes; None when it is still open."""
    s.settimeout(timeout)
    out = b""
    try:
        while True:
            d = s.recv(65536)
            if not d:
                return out
            out += d
    except socket.timeout:
        return None
    except ConnectionResetError:
        return out


def sanitized():
    """kcached was built with ASan: its quarantine keeps freed memory
    resident, so bounds on memory given back cannot be measured."""
    with open(tr.kcached_path(), "rb") as f:
        return b"__asan_init" in f.read()


def refused(srv, reason):
    return (
        tr.metric(
            srv.metrics(), "kcached_resp_refused_total", 'reason="%s"' % reason
        )
        or 0
    )


Case = tr.ServerCase


class CrossProtocol(Case):
    """No token file: the loopback developer's kcached, where every RESP
    client is admin: a web page's POST must run nothing."""

    def setUp(self):
        self.r = self.srv.client()
        self.r.set("pt2:model", "compiled")

    def tearDown(self):
        self.r.close()

    def test_browser_post_runs_nothing(self):
        body = b"SET x pwned\r\nFLUSHALL\r\n"
        req = (
            b"POST / HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: "
            b"http://evil.example\r\nContent-Type: text/plain\r\n"
            b"Content-Length: %d\r\n\r\n" % (self.srv.port, len(body)) + body
        )
        s = connect(self.srv.port)
        s.sendall(req)
        self.assertEqual(read_to_eof(s), b"")  # closed, nothing answered
        s.close()
        self.assertEqual(self.r.get("pt2:model"), b"compiled")
        self.assertIsNone(self.r.get("x"))
        self.assertGreaterEqual(refused(self.srv, "http"), 1)
        self.assertIn("Possible SECURITY ATTACK detected", self.srv.log_text())

    def test_http_lines_close_wherever_they_come(self):
        cases = [
            b"GET / HTTP/1.1\r\nHost: a\r\n\r\nSET x pwned\r\n",
            b"PUT /v1/x HTTP/1.0\r\n\r\nSET x pwned\r\n",
            b"OPTIONS * HTTP/1.1\r\n\r\nSET x pwned\r\n",
            b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\nSET x pwned\r\n",
            b"post /\r\nSET x pwned\r\n",
            b"*1\r\n$4\r\nPOST\r\n*3\r\n$3\r\nSET\r\n$1\r\nx\r\n$1\r\ny\r\n",
        ]
        for data in cases:
            s = connect(self.srv.port)
            s.sendall(data)
            self.assertEqual(read_to_eof(s), b"", data)
            s.close()
        # Host: after a command: that command ran, nothing after it
        s = connect(self.srv.port)
        s.sendall(b"PING\r\nHost: evil\r\nSET x pwned\r\nFLUSHALL\r\n")
        self.assertEqual(read_to_eof(s), b"+PONG\r\n")
        s.close()
        self.assertIsNone(self.r.get("x"))
        self.assertEqual(self.r.get("pt2:model"), b"compiled")

    def test_first_bytes_not_resp_are_refused(self):
        err = (
            b"-ERR Protocol error: expected a RESP array ('*') or an "
            b"inline command\r\n"
        )
        for data in (
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfcSET x pwned\r\n",
            b'{"cmd": "x"}\r\nSET x pwned\r\n',
            b"\x00SET x pwned\r\n",
            b"<html>\r\nSET x pwned\r\n",
            b"SET x \x01\x02pwned\r\n",
            b"SET\rx pwned\r\n",
        ):
            s = connect(self.srv.port)
            s.sendall(data)
            self.assertEqual(read_to_eof(s), err, data)
            s.close()
        self.assertIsNone(self.r.get("x"))
        self.assertGreaterEqual(refused(self.srv, "not_resp"), 6)

    def test_what_redis_clients_send_still_works(self):
        # values that look like HTTP are data when framed as RESP
        self.assertTrue(self.r.set("/", "HTTP/1.1"))
        self.assertEqual(self.r.execute_command("ECHO", "POST"), b"POST")
        self.assertEqual(self.r.get("/"), b"HTTP/1.1")
        # inline commands, as telnet sends them, blank lines first
        self.assertEqual(
            tr.raw(self.srv.port, b"\r\n PING\r\nECHO HTTP\r\n"),
            b"+PONG\r\n$4\r\nHTTP\r\n",
        )
        self.assertEqual(tr.raw(self.srv.port, b"ping\n"), b"+PONG\r\n")


class KeysPattern(Case):
    """KEYS and SCAN MATCH refuse a pattern of more than 16 '*' runs or
    1024 bytes (a crafted one froze Redis's thread for 19 s)."""

    def test_pattern_limit(self):
        r = self.srv.client()
        r.set(b"a" * 100 + b"b", "1")
        ok = b"*a" * 16 + b"b"
        self.assertEqual(r.keys(ok), [b"a" * 100 + b"b"])
        self.assertEqual(r.keys(b"**a" * 16 + b"b"), [b"a" * 100 + b"b"])
        self.assertEqual(r.keys(b"\\*a" * 40), [])  # escaped: no runs
        for bad in (b"*a" * 17 + b"b", b"a" * 1025):
            with self.assertRaises(redis.exceptions.ResponseError) as cm:
                r.keys(bad)
            self.assertIn("pattern too complex", str(cm.exception))
            with self.assertRaises(redis.exceptions.ResponseError):
                r.scan(0, match=bad)
        self.assertEqual(
            r.scan(0, match=ok, count=1000)[1], [b"a" * 100 + b"b"]
        )
        r.close()


class TokenRevocation(unittest.TestCase):
    """A SIGHUP that removes a token or changes its role closes the open
    connections that authenticated with it; the others keep theirs."""

    def setUp(self):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        self.toks, self.path = tr.make_tokens(d)
        self.srv = tr.Kcached("--tokens", self.path, data_dir=d).start()

    def tearDown(self):
        self.srv.stop()
        shutil.rmtree(self.srv.dir, ignore_errors=True)

    def authed(self, role, name=b""):
        s = connect(self.srv.port)
        tok = self.toks[role].encode()
        s.sendall(b"AUTH " + (name + b" " if name else b"") + tok + b"\r\n")
        self.assertEqual(tr.read_exactly(s, 5), b"+OK\r\n")
        return s

    def reload(self, lines):
        with open(self.path) as f:
            old = f.read().splitlines()
        with open(self.path + ".new", "w") as f:
            f.write("\n".join(lines(old)) + "\n")
        os.rename(self.path + ".new", self.path)
        before = self.srv.log_text().count("SIGHUP: reloaded")
        self.srv.proc.send_signal(signal.SIGHUP)
        deadline = time.time() + 10
        while self.srv.log_text().count("SIGHUP: reloaded") == before:
            self.assertLess(time.time(), deadline, "no reload logged")
            time.sleep(0.02)

    def test_removed_and_changed_tokens_close_their_connections(self):
        writer = self.authed("write")
        busy = self.authed("write", b"writer")  # sends right after SIGHUP
        admin = self.authed("admin")
        reader = self.authed("read")
        # writer removed, admin demoted to read; reader unchanged
        self.reload(
            lambda old: (
                [
                    l
                    for l in old
                    if " writer " not in l and not l.startswith("admin ")
                ]
                + [
                    l.replace("admin ", "read ", 1)
                    for l in old
                    if l.startswith("admin ")
                ]
            )
        )
        try:  # the sweep may have closed it already: no reply either way
            busy.sendall(b"SET revoked 1\r\nDEL pt2:a\r\n")
        except OSError:
            pass
        self.assertEqual(read_to_eof(busy), b"")
        # idle ones are closed by the once-a-second sweep
        for s in (writer, admin):
            self.assertEqual(read_to_eof(s, 5), b"")
        reader.sendall(b"GET revoked\r\n")
        self.assertEqual(tr.read_exactly(reader, 5), b"$-1\r\n")
        reader.sendall(b"PING\r\n")
        self.assertEqual(tr.read_exactly(reader, 7), b"+PONG\r\n")
        for s in (writer, busy, admin, reader):
            s.close()
        self.assertEqual(refused(self.srv, "token_revoked"), 3)
        # the demoted token authenticates again, with its new role
        s = self.authed("admin")
        s.sendall(b"SET a 1\r\nGET a\r\n")
        want = (
            b"-NOPERM this user has no permissions to run the 'set' "
            b"command\r\n$-1\r\n"
        )
        self.assertEqual(tr.read_exactly(s, len(want)), want)
        s.close()

    def test_reload_without_change_keeps_connections(self):
        s = self.authed("write")
        self.reload(lambda old: old)
        time.sleep(1.5)  # a sweep ran
        s.sendall(b"SET kept 1\r\n")
        self.assertEqual(tr.read_exactly(s, 5), b"+OK\r\n")
        s.close()
        self.assertEqual(refused(self.srv, "token_revoked"), 0)


class IdleTimeout(Case):
    FLAGS = ("--resp-timeout", "1")

    def test_idle_closed_busy_kept(self):
        idle = connect(self.srv.port)
        busy = connect(self.srv.port)
        t0 = time.time()
        while time.time() - t0 < 3:
            busy.sendall(b"PING\r\n")
            self.assertEqual(tr.read_exactly(busy, 7), b"+PONG\r\n")
            time.sleep(0.25)
        self.assertEqual(read_to_eof(idle, 1), b"")
        busy.close()
        idle.close()
        self.assertGreaterEqual(refused(self.srv, "idle"), 1)

    def test_redis_py_reconnects_a_pooled_connection(self):
        r = self.srv.client()
        self.assertTrue(r.set("k", "v"))
        before = refused(self.srv, "idle")
        time.sleep(2.5)
        self.assertGreater(refused(self.srv, "idle"), before)
        self.assertEqual(r.get("k"), b"v")  # the pool reconnects
        r.close()


class ArgumentTables(Case):
    def test_cap(self):
        s = connect(self.srv.port)
        s.sendall(b"*65537\r\n")
        self.assertEqual(
            read_to_eof(s),
            b"-ERR Protocol error: invalid multibulk length\r\n",
        )
        s.close()
        n = 65535
        cmd = b"*%d\r\n$6\r\nEXISTS\r\n" % (n + 1) + b"".join(
            b"$1\r\n%d\r\n" % (i % 10) for i in range(n)
        )
        s = connect(self.srv.port)
        s.sendall(cmd)
        self.assertEqual(tr.read_exactly(s, 4), b":0\r\n")
        s.close()

    def test_big_commands_leave_no_tables(self):
        """40 connections each send one command of 60000 arguments and go
        on with small ones (never idle long enough for the idle trim):
        their argument tables (about 2 MB each) are freed after the big
        command ran, not kept."""
        n, conns = 60000, 40
        cmd = b"*%d\r\n$6\r\nEXISTS\r\n" % (n + 1) + b"".join(
            b"$7\r\nk:%05d\r\n" % i for i in range(n)
        )
        pid = self.srv.proc.pid
        warm = connect(self.srv.port)  # the allocator's arenas warm up
        warm.sendall(cmd)
        self.assertEqual(tr.read_exactly(warm, 4), b":0\r\n")
        warm.close()
        time.sleep(1)
        socks = [connect(self.srv.port) for _ in range(conns)]
        before = tr.rss_anon_kib(pid)

        def ping_all():
            for s in socks:
                s.sendall(b"PING\r\n")
            for s in socks:
                self.assertEqual(tr.read_exactly(s, 7), b"+PONG\r\n")

        for s in socks:
            s.sendall(cmd)
            self.assertEqual(tr.read_exactly(s, 4), b":0\r\n")
            ping_all()
        time.sleep(1.2)  # the heap is trimmed once a second
        ping_all()
        grown = tr.rss_anon_kib(pid) - before
        for s in socks:
            s.close()
        # kept: 40 x (16 B x 2 tables x 64K) = 80 MB
        if not sanitized():
            self.assertLess(grown, 24 * 1024, grown)

    def test_idle_connections_give_their_buffers_back(self):
        """250 connections each pipeline 6000 PINGs (their input and
        output buffers grow to about 64K each), then idle: after 2 s
        the buffers are freed, as Redis frees an idle client's query
        buffer."""
        pid = self.srv.proc.pid
        socks = [connect(self.srv.port) for _ in range(250)]
        time.sleep(0.5)
        before = tr.rss_anon_kib(pid)
        for s in socks:
            s.sendall(b"PING\r\n" * 6000)
        for s in socks:
            self.assertEqual(len(tr.read_exactly(s, 7 * 6000)), 7 * 6000)
        busy = tr.rss_anon_kib(pid) - before
        time.sleep(3.5)
        idle = tr.rss_anon_kib(pid) - before
        for s in socks:
            s.close()
        if not sanitized():
            self.assertLess(idle, 8 * 1024, (busy, idle))


BIG = 4 << 20


class OutputBudget(Case):
    FLAGS = (
        "--resp-max-value",
        "4M",
        "--resp-output-limit",
        "16M",
        "--resp-output-total",
        "48M",
        "--resp-output-stall",
        "3",
    )

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        r = cls.srv.client()
        r.set("big", os.urandom(BIG))
        r.set("small", "s")
        r.close()

    def test_mget_of_a_big_key_repeated_is_refused(self):
        r = self.srv.client()
        before = refused(self.srv, "output_limit")
        with self.assertRaises(redis.exceptions.ResponseError) as cm:
            r.mget(["big"] * 100)  # 400 MB
        self.assertIn("would pass the output limit", str(cm.exception))
        self.assertEqual(len(r.mget(["big"] * 3)[2]), BIG)  # 12 MB fits
        self.assertEqual(r.get("small"), b"s")
        self.assertGreater(refused(self.srv, "output_limit"), before)
        # inside MULTI too
        p = r.pipeline(transaction=True)
        p.mget(["big"] * 10)
        p.get("small")
        res = p.execute(raise_on_error=False)
        self.assertIsInstance(res[0], redis.exceptions.ResponseError)
        self.assertEqual(res[1], b"s")
        r.close()

    def test_readers_that_never_read(self):
        """40 clients pipeline GETs of a 4 MB value and never read: the
        replies kcached holds stay within --resp-output-total (48M); a
        big reply to another client meanwhile gets an error, small ones
        go on; after --resp-output-stall the stalled ones are closed."""
        pid = self.srv.proc.pid
        before = tr.rss_anon_kib(pid)
        socks = []
        for _ in range(40):
            s = socket.socket()
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.connect(("127.0.0.1", self.srv.port))
            s.sendall(b"GET big\r\n" * 8)
            socks.append(s)
        time.sleep(1)
        grown = tr.rss_anon_kib(pid) - before
        # 40 x 4 MB held without the budget
        self.assertLess(grown, 64 * 1024, grown)
        r = self.srv.client()
        self.assertEqual(r.get("small"), b"s")
        with self.assertRaises(redis.exceptions.ResponseError):
            r.get("big")
        # the stalled ones are closed: their budget comes back
        deadline = time.time() + 15
        while True:
            try:
                self.assertEqual(len(r.get("big")), BIG)
                break
            except redis.exceptions.ResponseError:
                self.assertLess(time.time(), deadline)
                time.sleep(0.2)
        self.assertGreaterEqual(refused(self.srv, "output_stalled"), 1)
        r.close()
        for s in socks:
            s.close()


class Admission(Case):
    FLAGS = (
        "--resp-max-connections",
        "30",
        "--resp-max-connections-per-ip",
        "12",
    )

    def test_caps(self):
        port = self.srv.port
        time.sleep(0.5)  # Server.start's probe connection is closed
        held = [connect(port) for _ in range(12)]
        for s in held:
            s.sendall(b"PING\r\n")
            self.assertEqual(tr.read_exactly(s, 7), b"+PONG\r\n")
        s = connect(port)
        self.assertEqual(
            read_to_eof(s),
            b"-ERR max number of clients from this address reached\r\n",
        )
        s.close()
        # other addresses still get in, up to the total
        held += [connect(port, "127.0.0.2") for _ in range(12)]
        held += [connect(port, "127.0.0.3") for _ in range(6)]
        for s in held[12:]:
            s.sendall(b"PING\r\n")
            self.assertEqual(tr.read_exactly(s, 7), b"+PONG\r\n")
        s = connect(port, "127.0.0.4")
        self.assertEqual(
            read_to_eof(s), b"-ERR max number of clients reached\r\n"
        )
        s.close()
        # a closed connection gives its slots back
        held.pop(0).close()
        time.sleep(0.2)
        s = connect(port)
        s.sendall(b"INFO clients\r\n")
        s.settimeout(5)
        self.assertIn(b"maxclients:30", s.recv(4096))
        held.append(s)
        for s in held:
            s.close()
        self.assertEqual(refused(self.srv, "per_ip"), 1)
        self.assertEqual(refused(self.srv, "max_connections"), 1)


class UploadInFlight(Case):
    """A blob's first HTTP upload counts as just offered: the manifest that
    will reference it comes last, so a RESP key of the same bytes set and
    deleted (or evicted) in between must not take the blob with it."""

    FLAGS = ("--resp-max-bytes", "1M")

    def blob_status(self, digest, method="HEAD", body=None):
        import urllib.error
        import urllib.request

        req = urllib.request.Request(
            "%s/v1/blobs/%s" % (self.srv.url, digest), data=body, method=method
        )
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    def uploaded(self, tag):
        import hashlib

        body = (tag * 65536)[:65536]
        digest = hashlib.sha256(body).hexdigest()
        self.assertEqual(self.blob_status(digest, "PUT", body), 201)
        return body, digest

    def test_del_keeps_an_upload(self):
        r = self.srv.client()
        body, digest = self.uploaded(b"in flight, then DEL ")
        r.set("same-bytes", body)
        self.assertEqual(r.delete("same-bytes"), 1)
        self.assertEqual(self.blob_status(digest), 200)
        # a value only RESP ever held is still freed by its DEL
        own = b"resp only " * 6554
        r.set("own", own)
        r.delete("own")
        import hashlib

        self.assertEqual(
            self.blob_status(hashlib.sha256(own).hexdigest()), 404
        )
        r.close()

    def test_eviction_keeps_an_upload(self):
        r = self.srv.client()
        body, digest = self.uploaded(b"in flight, then evicted ")
        r.set("evictable", body)
        for i in range(40):  # 2.5 MiB through a 1 MiB RESP budget
            r.set("filler:%d" % i, os.urandom(65536))
        self.assertEqual(r.exists("evictable"), 0)
        self.assertEqual(self.blob_status(digest), 200)
        r.close()


if __name__ == "__main__":
    tr.main_with_kcached(__doc__)
