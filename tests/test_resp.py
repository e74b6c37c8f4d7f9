#!/usr/bin/env python3
"""test_resp.py: kcached's Redis protocol listener (--resp-listen) against
redis-py, redis-cli, redis-benchmark and raw sockets: a real kcached on free
loopback ports over a temporary LMDB store (kcharness.py).

usage: test_resp.py KCACHED [unittest args]
(exit 77: redis-py missing; a failure instead when CI=true, as for
redis-cli and redis-benchmark)

Exact reply bytes below were checked against redis-server 7.0.15."""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
import unittest
import http.server
import urllib.request

import kcharness
from kcharness import (
    FakeS3,
    Kcached as Server,
    ServerCase,
    make_tokens,
    metric,
    raw,
    read_exactly,
    rss_anon_kib,
)

redis = kcharness.need("redis", "python3-redis")


def settled(srv):
    """RESP SETs answered as already held (no commit), so far."""
    return (
        metric(
            srv.metrics(),
            "kcached_ops_total",
            'op="set",frontend="resp",result="present"',
        )
        or 0
    )


class OpenServer(ServerCase):
    """No token file: every command allowed (loopback only)."""

    def setUp(self):
        self.r = self.srv.client()
        self.r.flushdb()

    def tearDown(self):
        self.r.close()

    def raw(self, data, expect=None):
        return raw(self.srv.port, data, expect)

    def check(self, data, want, msg=None):
        self.assertEqual(self.raw(data, want), want, msg or data[:60])

    def test_binary_values_every_byte(self):
        val = bytes(range(256)) * 5
        key = bytes(range(1, 256)) + b"\x00"
        self.assertTrue(self.r.set(key, val))
        self.assertEqual(self.r.get(key), val)
        self.assertEqual(self.r.strlen(key), len(val))
        self.assertTrue(self.r.set(b"empty", b""))
        self.assertEqual(self.r.get(b"empty"), b"")
        big = os.urandom(5 << 20)
        self.assertTrue(self.r.set("big", big))
        self.assertEqual(self.r.get("big"), big)

    def test_missing_keys(self):
        self.assertIsNone(self.r.get("nope"))
        self.assertEqual(self.r.mget("nope", "nada"), [None, None])
        self.assertEqual(self.r.ttl("nope"), -2)
        self.assertEqual(self.r.pttl("nope"), -2)
        self.assertEqual(self.r.type("nope"), b"none")
        self.assertEqual(self.r.strlen("nope"), 0)
        self.assertEqual(self.r.exists("nope"), 0)
        self.assertEqual(self.r.delete("nope"), 0)
        self.assertEqual(self.r.persist("nope"), 0)
        self.assertEqual(self.r.delete(""), 0)  # a key the store cannot hold
        self.assertEqual(self.r.delete("", "x" * 70000, "nope"), 0)
        self.assertIsNone(self.r.get(""))
        self.assertEqual(self.r.exists(""), 0)
        self.assertEqual(self.r.expire("nope", 10), 0)

    def test_set_options(self):
        r = self.r
        self.assertIsNone(r.set("k", "1", xx=True))
        self.assertIsNone(r.get("k"))
        self.assertTrue(r.set("k", "1", nx=True))
        self.assertIsNone(r.set("k", "2", nx=True))
        self.assertEqual(r.get("k"), b"1")
        self.assertTrue(r.set("k", "3", xx=True))
        self.assertEqual(r.set("k", "4", get=True), b"3")
        self.assertIsNone(r.set("fresh", "x", get=True))
        self.assertTrue(r.set("k", "5", ex=100))
        self.assertTrue(r.set("k", "6", keepttl=True))
        self.assertGreater(r.ttl("k"), 90)
        self.assertTrue(r.set("k", "7"))
        self.assertEqual(r.ttl("k"), -1)
        self.assertTrue(r.set("k", "8", pxat=int(time.time() * 1000) + 50000))
        self.assertGreater(r.pttl("k"), 40000)
        self.assertTrue(r.set("k", "9", exat=int(time.time()) + 500))
        self.assertGreater(r.ttl("k"), 400)
        self.assertEqual(r.setnx("k", "x"), False)
        self.assertEqual(r.setnx("n", "x"), True)
        self.assertTrue(r.setex("se", 100, "v"))
        self.assertGreater(r.ttl("se"), 90)
        self.assertTrue(r.psetex("pse", 100000, "v"))
        self.assertGreater(r.pttl("pse"), 90000)
        self.assertTrue(r.mset({"m1": "a", "m2": "b"}))
        self.assertEqual(r.mget("m1", "m2", "m3"), [b"a", b"b", None])
        self.assertEqual(r.exists("m1", "m1", "m3"), 2)
        self.assertEqual(r.delete("m1", "m2", "m3"), 2)
        self.assertEqual(r.unlink("n", "n"), 1)
        self.assertEqual(r.type("k"), b"string")

    def test_set_of_what_is_held(self):
        """A SET of the value and expiry a key holds is answered without a
        commit (nothing changes); anything else commits: a TTL cleared by
        SET without EX, a new value after an identical one, and SETs behind
        an earlier write of the same pipeline (not yet committed)."""
        r, v, w = self.r, b"x" * 5000, b"y" * 5000
        before = settled(self.srv)
        for _ in range(3):
            self.assertTrue(r.set("k", v))
        self.assertEqual(settled(self.srv) - before, 2)  # all but the first
        self.assertEqual(r.get("k"), v)
        self.assertTrue(r.set("k", w))
        self.assertEqual(r.get("k"), w)
        self.assertTrue(r.set("k", w, ex=100))
        self.assertTrue(r.set("k", w, keepttl=True))
        self.assertGreater(r.ttl("k"), 90)
        self.assertTrue(r.set("k", w))
        self.assertEqual(r.ttl("k"), -1)
        self.assertIsNone(r.set("k", w, nx=True))
        self.assertEqual(r.setnx("k", w), False)
        self.assertIsNone(r.set("absent", w, xx=True))
        self.assertEqual(r.exists("absent"), 0)
        # the second SET k w follows an open write of k: it must commit
        p = r.pipeline(transaction=False)
        p.set("k", v).set("k", w).get("k")
        self.assertEqual(p.execute(), [True, True, w])
        p = r.pipeline(transaction=False)
        p.delete("k").set("k", w).get("k")
        self.assertEqual(p.execute(), [1, True, w])
        p = r.pipeline(transaction=True)
        p.set("k", w).set("k", v)
        self.assertEqual(p.execute(), [True, True])
        self.assertEqual(r.get("k"), v)

    def test_expiry(self):
        r = self.r
        r.set("s", "v", ex=1)
        r.set("p", "v", px=300)
        r.set("keep", "v")
        self.assertIn(r.ttl("s"), (1, 0))
        time.sleep(1.3)
        self.assertIsNone(r.get("s"))
        self.assertIsNone(r.get("p"))
        self.assertEqual(r.exists("s", "p"), 0)
        self.assertEqual(r.get("keep"), b"v")
        # EXPIRE and its options
        self.assertEqual(r.expire("keep", 100, xx=True), False)
        self.assertEqual(r.expire("keep", 100, nx=True), True)
        self.assertEqual(r.expire("keep", 50, nx=True), False)
        self.assertEqual(r.expire("keep", 50, gt=True), False)
        self.assertEqual(r.expire("keep", 200, gt=True), True)
        self.assertEqual(r.expire("keep", 300, lt=True), False)
        self.assertEqual(r.expire("keep", 150, lt=True), True)
        self.assertIn(r.ttl("keep"), (150, 149))
        self.assertEqual(r.persist("keep"), True)
        self.assertEqual(r.persist("keep"), False)
        self.assertEqual(r.pexpire("keep", 100000), True)
        self.assertGreater(r.pttl("keep"), 90000)
        self.assertEqual(r.expireat("keep", int(time.time()) + 1000), True)
        self.assertGreater(r.ttl("keep"), 900)
        self.assertEqual(r.pexpireat("keep", 1000), True)  # in the past
        self.assertIsNone(r.get("keep"))
        r.set("neg", "v")
        self.assertEqual(r.expire("neg", -1), True)
        self.assertEqual(r.exists("neg"), 0)

    def test_expired_keys_reclaimed(self):
        for i in range(20):
            self.r.set("gone%d" % i, "v", px=100)
        self.r.set("stays", "v")
        deadline = time.time() + 10
        while self.r.dbsize() > 1 and time.time() < deadline:
            time.sleep(0.2)
        self.assertEqual(self.r.dbsize(), 1)

    def test_pipelines(self):
        for tx in (False, True):
            p = self.r.pipeline(transaction=tx)
            for i in range(1000):
                p.set("p%d" % i, "v%d" % i)
            p.get("p999")
            res = p.execute()
            self.assertEqual(res[:1000], [True] * 1000)
            self.assertEqual(
                res[1000],
                b"v999" if not tx else None,
                "in MULTI, reads see the state before EXEC",
            )
            p = self.r.pipeline(transaction=tx)
            for i in range(1000):
                p.get("p%d" % i)
            self.assertEqual(p.execute(), [b"v%d" % i for i in range(1000)])
            self.assertEqual(self.r.dbsize(), 1000)
            self.r.flushdb()

    def test_pipeline_reads_see_earlier_writes(self):
        out = self.raw(
            b"SET a 1\r\nGET a\r\nSET a 2\r\nGET a\r\nDEL a\r\n"
            b"GET a\r\nINCR a\r\nPING\r\n"
        )
        self.assertEqual(
            out,
            b"+OK\r\n$1\r\n1\r\n+OK\r\n$1\r\n2\r\n:1\r\n"
            b"$-1\r\n-ERR unknown command 'INCR', with args "
            b"beginning with: 'a' \r\n+PONG\r\n",
        )

    def test_multi_exec_discard(self):
        cases = [
            (
                b"MULTI\r\nMULTI\r\nSET a 1\r\nEXEC\r\n",
                b"+OK\r\n-ERR MULTI calls can not be nested\r\n+QUEUED\r\n"
                b"*1\r\n+OK\r\n",
            ),
            (
                b"MULTI\r\nFOO\r\nSET a 1\r\nEXEC\r\n",
                b"+OK\r\n-ERR unknown command 'FOO', with args beginning with: "
                b"\r\n+QUEUED\r\n-EXECABORT Transaction discarded because of "
                b"previous errors.\r\n",
            ),
            (
                b"MULTI\r\nGET\r\nEXEC\r\n",
                b"+OK\r\n-ERR wrong number of arguments for 'get' command\r\n"
                b"-EXECABORT Transaction discarded because of previous "
                b"errors.\r\n",
            ),
            (
                b"MULTI\r\nSET b 1 ex x\r\nGET a\r\nEXEC\r\n",
                b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n-ERR value is not an "
                b"integer or out of range\r\n$1\r\n1\r\n",
            ),
            (
                b"MULTI\r\nDISCARD\r\nDISCARD\r\n",
                b"+OK\r\n+OK\r\n-ERR DISCARD without MULTI\r\n",
            ),
            (b"MULTI\r\nEXEC\r\n", b"+OK\r\n*0\r\n"),
            (b"EXEC\r\n", b"-ERR EXEC without MULTI\r\n"),
            (
                b"MULTI\r\nSELECT 0\r\nPING\r\nEXEC\r\n",
                b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n+PONG\r\n",
            ),
            (
                b"MULTI\r\nEXEC foo\r\nEXEC\r\n",
                b"+OK\r\n-EXECABORT Transaction discarded because of: wrong "
                b"number of arguments for 'exec' command\r\n-ERR EXEC without "
                b"MULTI\r\n",
            ),
            (
                b"MULTI\r\nSET t 1\r\nGET t\r\nDEL t t\r\nEXEC\r\nGET t\r\n",
                b"+OK\r\n+QUEUED\r\n+QUEUED\r\n+QUEUED\r\n*3\r\n+OK\r\n$-1\r\n"
                b":1\r\n$-1\r\n",
            ),
        ]
        self.r.set("a", "1")
        for cmd, want in cases:
            self.check(cmd, want)
        # DISCARD drops the queued writes
        self.assertEqual(
            self.raw(b"MULTI\r\nSET d 1\r\nDISCARD\r\nGET d\r\n"),
            b"+OK\r\n+QUEUED\r\n+OK\r\n$-1\r\n",
        )

    def test_error_texts(self):
        cases = [
            (
                b"foo a b",
                b"-ERR unknown command 'foo', with args beginning "
                b"with: 'a' 'b' ",
            ),
            (b"get", b"-ERR wrong number of arguments for 'get' command"),
            (b"set k v ex 0", b"-ERR invalid expire time in 'set' command"),
            (
                b"set k v ex abc",
                b"-ERR value is not an integer or out of range",
            ),
            (b"set k v nx xx", b"-ERR syntax error"),
            (b"set k v ex", b"-ERR syntax error"),
            (b"set k v ex 10 px 10", b"-ERR syntax error"),
            (b"set k v keepttl ex 1", b"-ERR syntax error"),
            (b"set k v exat 0", b"-ERR invalid expire time in 'set' command"),
            (
                b"set k v ex 9223372036854775807",
                b"-ERR invalid expire time in 'set' command",
            ),
            (
                b"set k v px 9223372036854775807",
                b"-ERR invalid expire time in 'set' command",
            ),
            (b"setex k 0 v", b"-ERR invalid expire time in 'setex' command"),
            (
                b"psetex k -1 v",
                b"-ERR invalid expire time in 'psetex' command",
            ),
            (b"expire k abc", b"-ERR value is not an integer or out of range"),
            (
                b"expire k 10 nx xx",
                b"-ERR NX and XX, GT or LT options at the "
                b"same time are not compatible",
            ),
            (
                b"expire k 10 gt lt",
                b"-ERR GT and LT options at the same time are not compatible",
            ),
            (b"expire k 10 foo", b"-ERR Unsupported option foo"),
            (
                b"expire k 99999999999999999",
                b"-ERR invalid expire time in 'expire' command",
            ),
            (b"select 1", b"-ERR DB index is out of range"),
            (b"select x", b"-ERR value is not an integer or out of range"),
            (b"select 0", b"+OK"),
            (b"hello 4", b"-NOPROTO unsupported protocol version"),
            (b"hello 1", b"-NOPROTO unsupported protocol version"),
            (
                b"hello x",
                b"-ERR Protocol version is not an integer or out of range",
            ),
            (
                b"client setname 'a b'",
                b"-ERR Client names cannot contain "
                b"spaces, newlines or special characters.",
            ),
            (
                b"client foo",
                b"-ERR unknown subcommand 'foo'. Try CLIENT HELP.",
            ),
            (
                b"client setname",
                b"-ERR wrong number of arguments for 'client|setname' command",
            ),
            (
                b"command foo",
                b"-ERR unknown subcommand 'foo'. Try COMMAND HELP.",
            ),
            (
                b"config get",
                b"-ERR wrong number of arguments for 'config|get' command",
            ),
            (b"scan x", b"-ERR invalid cursor"),
            (b"scan 0 count 0", b"-ERR syntax error"),
            (b"scan 0 foo", b"-ERR syntax error"),
            (
                b"ping a b",
                b"-ERR wrong number of arguments for 'ping' command",
            ),
            (b"flushdb foo", b"-ERR syntax error"),
            (
                b"mset a 1 b",
                b"-ERR wrong number of arguments for 'mset' command",
            ),
            (b"auth a b c", b"-ERR syntax error"),
            (b"discard", b"-ERR DISCARD without MULTI"),
        ]
        for cmd, want in cases:
            self.check(cmd + b"\r\n", want + b"\r\n")

    def test_connection_commands(self):
        r = self.r
        self.assertTrue(r.ping())
        self.assertEqual(r.echo(b"\x00\xff"), b"\x00\xff")
        self.assertTrue(r.client_setname("inductor"))
        self.assertIn(r.client_getname(), ("inductor", b"inductor"))
        self.assertIsInstance(r.client_id(), int)
        self.assertEqual(
            r.execute_command("CLIENT", "SETINFO", "lib-name", "redis-py"),
            b"OK",
        )
        self.assertGreater(r.command_count(), 20)
        self.assertEqual(r.config_get("save"), {"save": ""})
        self.assertEqual(r.config_get("appendonly"), {"appendonly": "no"})
        self.assertEqual(r.config_get("nosuch"), {})
        hello = r.execute_command("HELLO", "2")
        self.assertEqual(
            hello[:4], [b"server", b"redis", b"version", b"7.0.0"]
        )
        self.assertEqual(self.raw(b"QUIT\r\nPING\r\n"), b"+OK\r\n<EOF>")

    def test_info_and_dbsize(self):
        r = self.r
        self.assertEqual(r.dbsize(), 0)
        self.assertEqual(r.info("keyspace"), {})
        r.mset({"a": "1", "b": "2"})
        r.set("c", "3", ex=100)
        self.assertEqual(r.dbsize(), 3)
        ks = r.info("keyspace")["db0"]
        self.assertEqual(ks["keys"], 3)
        self.assertEqual(ks["expires"], 1)
        info = r.info()
        for field in (
            "redis_version",
            "connected_clients",
            "used_memory",
            "keyspace_hits",
            "uptime_in_seconds",
        ):
            self.assertIn(field, info)
        self.assertGreaterEqual(info["connected_clients"], 1)
        self.assertEqual(r.info("nosuch"), {})

    def test_scan_and_keys(self):
        r = self.r
        names = {("key:%d" % i).encode() for i in range(300)}
        names |= {b"other:1", b"other:2"}
        r.mset({n: b"v" for n in names})
        seen, cur = set(), 0
        while True:
            cur, keys = r.scan(cur, match="key:*", count=50)
            seen |= set(keys)
            if cur == 0:
                break
        self.assertEqual(seen, {n for n in names if n.startswith(b"key:")})
        self.assertEqual(set(r.scan_iter()), names)
        self.assertEqual(set(r.scan_iter(_type="string")), names)
        self.assertEqual(r.scan(0, _type="hash"), (0, []))
        self.assertEqual(sorted(r.keys("other:*")), [b"other:1", b"other:2"])
        self.assertEqual(len(r.keys("*")), 302)
        self.assertEqual(
            r.keys("key:1?"), sorted(r.keys("key:1?")) and r.keys("key:1?")
        )
        self.assertEqual(
            set(r.keys("key:1?")), {b"key:%d" % i for i in range(10, 20)}
        )

    def test_metrics(self):
        self.r.get("m")
        self.r.set("m", "1")
        self.raw(b"NOSUCH\r\nGET\r\n", b"-ERR")
        text = self.srv.metrics()

        def value(labels):
            for line in text.splitlines():
                if line.startswith("kcached_resp_commands_total{%s}" % labels):
                    return int(line.split()[-1])
            self.fail("no metric " + labels)

        self.assertGreaterEqual(value('cmd="get",result="ok"'), 1)
        self.assertGreaterEqual(value('cmd="set",result="ok"'), 1)
        self.assertGreaterEqual(value('cmd="get",result="error"'), 1)
        self.assertGreaterEqual(value('cmd="unknown",result="error"'), 1)
        self.assertIn("kcached_resp_commits_total", text)

    def test_flush(self):
        self.r.mset({"a": "1", "b": "2"})
        self.assertTrue(self.r.flushall())
        self.assertEqual(self.r.dbsize(), 0)
        self.r.set("a", "1")
        self.assertTrue(self.r.flushdb(asynchronous=True))
        self.assertIsNone(self.r.get("a"))

    def test_concurrent_writers_group_commit(self):
        errors = []

        def writer(n):
            try:
                c = self.srv.client()
                for i in range(100):
                    assert c.set("w%d:%d" % (n, i), "x" * i)
                c.close()
            except Exception as e:
                errors.append(e)

        ts = [threading.Thread(target=writer, args=(n,)) for n in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])
        self.assertEqual(self.r.dbsize(), 1600)
        self.assertEqual(self.r.get("w7:42"), b"x" * 42)

    def test_random_pipelines_match_a_model(self):
        """Pipelines mixing writes, reads and transactions on 8 connections
        at once: every reply as a dict model of each connection's keys says
        (reads after writes see them; reads in MULTI see the state before)."""
        import random

        errors = []

        def worker(n):
            rnd = random.Random(n)
            c = self.srv.client()
            model = {}
            try:
                for _ in range(30):
                    tx = rnd.random() < 0.3
                    p = c.pipeline(transaction=tx)
                    want, before = [], dict(model)
                    for _ in range(rnd.randint(1, 60)):
                        k = "r%d:%d" % (n, rnd.randint(0, 9))
                        op = rnd.random()
                        seen = before if tx else model
                        if op < 0.4:
                            v = os.urandom(rnd.randint(0, 300))
                            p.set(k, v)
                            want.append(True)
                            model[k] = v
                        elif op < 0.55:
                            p.delete(k)
                            want.append(int(k in model))
                            model.pop(k, None)
                        elif op < 0.85:
                            p.get(k)
                            want.append(seen.get(k))
                        else:
                            p.exists(k)
                            want.append(int(k in seen))
                    got = p.execute()  # DEL counts in order, also in MULTI
                    assert got == want, (n, got, want)
            except Exception as e:
                errors.append(e)
            finally:
                c.close()

        ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])

    def test_read_after_commit_while_others_read(self):
        """A GET behind its connection's SET runs when the commit comes
        back, in a round of events where other connections' GETs began the
        round's read before the commit: it must see the SET, not that read's
        older state."""
        stop, errors = threading.Event(), []
        self.r.set("hot", "x" * 100)
        n_get = 32

        def reader():
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            want = (b"$100\r\n" + b"x" * 100 + b"\r\n") * n_get
            try:
                while not stop.is_set():
                    s.sendall(b"GET hot\r\n" * n_get)
                    assert read_exactly(s, len(want)) == want
            except Exception as e:
                errors.append(e)
            finally:
                s.close()

        def writer(n):
            s = socket.create_connection(("127.0.0.1", self.srv.port))
            try:
                for i in range(150):
                    v = b"%d:%d" % (n, i)
                    s.sendall(b"SET w%d %s\r\nGET w%d\r\n" % (n, v, n))
                    want = b"+OK\r\n$%d\r\n%s\r\n" % (len(v), v)
                    got = read_exactly(s, len(want))
                    assert got == want, (n, i, got, want)
            except Exception as e:
                errors.append(e)
            finally:
                s.close()

        rs = [threading.Thread(target=reader) for _ in range(4)]
        ws = [threading.Thread(target=writer, args=(n,)) for n in range(8)]
        for t in rs + ws:
            t.start()
        for t in ws:
            t.join()
        stop.set()
        for t in rs:
            t.join()
        self.assertEqual(errors, [])

    def test_pipeline_snapshots_only_move_forward(self):
        """DBSIZE, SCAN and KEYS read the store on their own, newer than
        the round's read that an earlier command of the pipeline began:
        the commands after them must not see the older state again. A
        writer adds keys k0, k1, ... one commit each, in order (what is
        stored is always a prefix of them); a pipeline of EXISTS (begins
        the round's read), a SCAN matching nothing over padding keys (a
        window for commits), DBSIZE and an MGET of every k must find at
        least the keys DBSIZE counted."""
        n_pad, n_keys = 20000, 400
        p = self.r.pipeline(transaction=False)
        for i in range(n_pad):
            p.set("pad%d" % i, "p")
        p.execute()
        stop, errors = threading.Event(), []

        def writer():
            w = self.srv.client()
            try:
                for i in range(n_keys):
                    w.set("k%d" % i, "v")
            except Exception as e:
                errors.append(e)
            finally:
                stop.set()
                w.close()

        t = threading.Thread(target=writer)
        t.start()
        ks = ["k%d" % i for i in range(n_keys)]
        behind, rounds = [], 0
        try:
            while not stop.is_set():
                p = self.r.pipeline(transaction=False)
                p.exists("nokey")
                p.scan(0, match="nomatch*", count=n_pad)
                p.dbsize()
                p.mget(ks)
                _, _, size, vals = p.execute()
                held = sum(v is not None for v in vals)
                rounds += 1
                if held < size - n_pad:
                    behind.append((size - n_pad, held))
        finally:
            stop.set()
            t.join()
        self.assertEqual(errors, [])
        self.assertGreater(rounds, 0)
        self.assertEqual(behind, [])

    def test_bad_input_closes_only_that_connection(self):
        other = self.srv.client()
        other.set("alive", "1")
        cases = [
            (
                b"*1\r\n$999999999999\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n<EOF>",
            ),
            (
                b"*1\r\n$-5\r\n",
                b"-ERR Protocol error: invalid bulk length\r\n<EOF>",
            ),
            (
                b"*99999999999\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n<EOF>",
            ),
            (
                b"*2000000\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n<EOF>",
            ),
            (
                b"*x\r\n",
                b"-ERR Protocol error: invalid multibulk length\r\n<EOF>",
            ),
            (
                b"*1\r\n+abc\r\n",
                b"-ERR Protocol error: expected '$', got '+'\r\n<EOF>",
            ),
            (
                b'PING\r\n"abc\r\n',
                b"+PONG\r\n-ERR Protocol error: "
                b"unbalanced quotes in request\r\n<EOF>",
            ),
            (
                b"PING\r\n*1\r\n$x\r\n",
                b"+PONG\r\n-ERR Protocol error: invalid bulk length\r\n<EOF>",
            ),
            (
                b"SET q 1\r\n*1\r\n$x\r\n",
                b"+OK\r\n-ERR Protocol error: invalid bulk length\r\n<EOF>",
            ),
            (
                b"A" * 70000,
                b"-ERR Protocol error: too big inline request\r\n<EOF>",
            ),
            (b"*-1\r\n*0\r\n\r\n\r\nPING\r\n", b"+PONG\r\n"),
            (
                b"*2\r\n$4\r\nECHO\r\n$3\r\nabcXY*1\r\n$4\r\nPING\r\n",
                b"$3\r\nabc\r\n+PONG\r\n",
            ),
        ]
        for data, want in cases:
            self.check(data, want)
            self.assertEqual(other.get("alive"), b"1")
        # an unterminated frame: the server waits; the client goes away
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        s.sendall(b"*3\r\n$3\r\nSET\r\n$1\r\nu\r\n$100\r\nabc")
        self.assertEqual(other.get("alive"), b"1")
        s.close()
        time.sleep(0.1)
        self.assertIsNone(other.get("u"))
        # byte by byte
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        for b in b"*3\r\n$3\r\nSET\r\n$2\r\nbb\r\n$3\r\nxyz\r\n":
            s.sendall(bytes([b]))
        s.settimeout(5)
        self.assertEqual(s.recv(100), b"+OK\r\n")
        s.close()
        self.assertEqual(other.get("bb"), b"xyz")
        other.close()

    def test_inline_quoting(self):
        self.assertEqual(
            self.raw(b'ECHO "a\\x41\\n\\""\r\n'), b'$4\r\naA\n"\r\n'
        )
        self.assertEqual(self.raw(b"ECHO 'b\\'c'\r\n"), b"$3\r\nb'c\r\n")
        self.assertEqual(
            self.raw(b'ECHO "a"b\r\n'),
            b"-ERR Protocol error: unbalanced quotes in request\r\n<EOF>",
        )
        self.assertEqual(self.raw(b"PING\n"), b"+PONG\r\n")

    def test_redis_cli_and_benchmark(self):
        cli = shutil.which("redis-cli")
        if not cli:
            kcharness.skip_or_fail(self, "redis-cli not installed")
        out = subprocess.run(
            [cli, "-p", str(self.srv.port), "PING"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(out.stdout.strip(), "PONG")
        out = subprocess.run(
            [cli, "-p", str(self.srv.port), "SET", "c", "v"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        self.assertEqual(out.stdout.strip(), "OK")
        self.assertEqual(self.raw(b"PING\r\n"), b"+PONG\r\n")
        bench = shutil.which("redis-benchmark")
        if not bench:
            kcharness.skip_or_fail(self, "redis-benchmark not installed")
        out = subprocess.run(
            [
                bench,
                "-p",
                str(self.srv.port),
                "-t",
                "set,get",
                "-n",
                "2000",
                "-q",
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("SET:", out.stdout)
        self.assertIn("GET:", out.stdout)
        self.assertNotIn("ERR", out.stdout + out.stderr)


class TokenServer(unittest.TestCase):
    """--tokens: AUTH, roles, Inductor's connect sequence."""

    @classmethod
    def setUpClass(cls):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        cls.toks, path = make_tokens(d)
        cls.srv = Server("--tokens", path, data_dir=d).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.srv.dir, ignore_errors=True)

    def test_inductor_sequence(self):
        # torch._inductor.remote_cache.RedisRemoteCacheBackend
        url = "redis://:%s@127.0.0.1:%d" % (self.toks["write"], self.srv.port)
        r = redis.Redis.from_url(url)
        key = "pt2:fx-graph-v1::abcdef0123"
        data = os.urandom(70000)
        self.assertIsNone(r.get(key))
        self.assertTrue(r.set(key, data, ex=3600))
        self.assertEqual(r.get(key), data)
        self.assertGreater(r.ttl(key), 3500)
        r.close()
        # with the token's name as the user
        url = "redis://writer:%s@127.0.0.1:%d" % (
            self.toks["write"],
            self.srv.port,
        )
        r = redis.Redis.from_url(url)
        self.assertEqual(r.get(key), data)
        r.close()

    def test_auth_matrix(self):
        p = self.srv.port
        self.assertEqual(
            raw(p, b"GET a\r\nSET a 1\r\nPING\r\nFLUSHDB\r\n"),
            b"-NOAUTH Authentication required.\r\n" * 4,
        )
        self.assertEqual(
            raw(p, b"AUTH wrong\r\nGET a\r\n"),
            b"-WRONGPASS invalid username-password pair or user "
            b"is disabled.\r\n-NOAUTH Authentication required.\r\n",
        )
        self.assertEqual(
            raw(p, b"foo\r\n"),
            b"-ERR unknown command 'foo', with args beginning with: \r\n",
        )
        self.assertEqual(
            raw(p, b"*20\r\n"),
            b"-ERR Protocol error: unauthenticated multibulk length\r\n<EOF>",
        )
        self.assertEqual(
            raw(p, b"*2\r\n$4\r\nECHO\r\n$20000\r\n"),
            b"-ERR Protocol error: unauthenticated bulk length\r\n<EOF>",
        )
        noperm = (
            b"-NOPERM this user has no permissions to run the '%s' command\r\n"
        )
        want = {
            "read": [
                b"+OK\r\n",
                b"$-1\r\n",
                noperm % b"set",
                noperm % b"del",
                noperm % b"flushdb",
            ],
            "write": [
                b"+OK\r\n",
                b"$-1\r\n",
                b"+OK\r\n",
                b":1\r\n",
                noperm % b"flushdb",
            ],
            "admin": [
                b"+OK\r\n",
                b"$-1\r\n",
                b"+OK\r\n",
                b":1\r\n",
                b"+OK\r\n",
            ],
        }
        for role, replies in want.items():
            tok = self.toks[role].encode()
            out = raw(
                p,
                b"AUTH " + tok + b"\r\nGET m\r\nSET m 1\r\nDEL m\r\n"
                b"FLUSHDB\r\n",
            )
            self.assertEqual(out, b"".join(replies), role)
        tok = self.toks["read"].encode()
        self.assertEqual(
            raw(p, b"AUTH reader " + tok + b"\r\nPING\r\n"),
            b"+OK\r\n+PONG\r\n",
        )
        self.assertEqual(
            raw(p, b"AUTH writer " + tok + b"\r\n"),
            b"-WRONGPASS invalid username-password pair or user "
            b"is disabled.\r\n",
        )
        out = raw(
            p,
            b"HELLO 2 AUTH writer "
            + self.toks["write"].encode()
            + b"\r\nSET h 1\r\n",
        )
        self.assertTrue(out.startswith(b"*14\r\n$6\r\nserver\r\n"), out)
        self.assertTrue(out.endswith(b"+OK\r\n"), out)
        self.assertTrue(
            raw(p, b"HELLO 2\r\n").startswith(b"-NOAUTH HELLO must")
        )
        r = redis.Redis(host="127.0.0.1", port=p, password="nope")
        with self.assertRaises(
            (
                redis.exceptions.ResponseError,
                redis.exceptions.AuthenticationError,
            )
        ) as cm:
            r.ping()
        self.assertIn(
            "WRONGPASS",
            str(cm.exception).upper() + "WRONGPASS"
            if "invalid username-password" in str(cm.exception)
            else str(cm.exception),
        )


class AnonymousWrite(unittest.TestCase):
    """Triton's backend: redis.Redis(host, port), no password, mget/set."""

    def test_triton_sequence(self):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        toks, path = make_tokens(d)
        srv = Server(
            "--tokens", path, "--resp-anonymous-role", "write", data_dir=d
        ).start()
        try:
            r = redis.Redis(host="127.0.0.1", port=srv.port)
            keys = [
                "triton:%s:%s" % ("ab" * 32, f)
                for f in ("k.cubin", "k.json", "k.ptx")
            ]
            self.assertEqual(r.mget(keys), [None, None, None])
            for k in keys:
                self.assertTrue(r.set(k, k.encode() * 100))
            self.assertEqual(r.mget(keys), [k.encode() * 100 for k in keys])
            with self.assertRaises(redis.exceptions.NoPermissionError):
                r.flushdb()
            r.close()
        finally:
            srv.stop()
            shutil.rmtree(d, ignore_errors=True)


class ReadThrough(unittest.TestCase):
    """With --s3-endpoint, a GET/MGET miss asks the bucket on the fetcher
    threads; other clients go on meanwhile."""

    def test_miss_reads_through_without_blocking(self):
        s3 = http.server.ThreadingHTTPServer(("127.0.0.1", 0), FakeS3)
        threading.Thread(target=s3.serve_forever, daemon=True).start()
        d = tempfile.mkdtemp(prefix="kc-resp-")
        env = dict(
            os.environ, AWS_ACCESS_KEY_ID="a", AWS_SECRET_ACCESS_KEY="b"
        )
        old = os.environ.copy()
        os.environ.update(env)
        srv = Server(
            "--s3-endpoint",
            "http://127.0.0.1:%d" % s3.server_address[1],
            "--s3-bucket",
            "bkt",
            "--s3-path-style",
            data_dir=d,
        ).start()
        os.environ.clear()
        os.environ.update(old)
        try:
            r, other = srv.client(), srv.client()
            r.set("here", "1")
            FakeS3.gets.clear()
            got = {}

            def slow():
                t = time.time()
                got["mget"] = r.mget("here", "gone")
                got["secs"] = time.time() - t

            t = threading.Thread(target=slow)
            t.start()
            time.sleep(0.2)
            t0 = time.time()
            self.assertTrue(other.ping())
            self.assertEqual(other.get("here"), b"1")
            self.assertLess(time.time() - t0, 0.5, "the listener waited")
            t.join()
            self.assertEqual(got["mget"], [b"1", None])
            self.assertGreaterEqual(got["secs"], 0.9)
            self.assertTrue(any("/kv" in g for g in FakeS3.gets), FakeS3.gets)
            n = len(FakeS3.gets)
            self.assertEqual(r.execute_command("MULTI"), b"OK")
            r.execute_command("GET", "gone2")
            self.assertEqual(r.execute_command("EXEC"), [None])
            self.assertEqual(len(FakeS3.gets), n, "no read-through in EXEC")
            r.close()
            other.close()
        finally:
            srv.stop()
            s3.shutdown()
            s3.server_close()
            shutil.rmtree(d, ignore_errors=True)


class Durability(unittest.TestCase):
    def test_sigkill_after_acknowledged_sets(self):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        srv = Server(data_dir=d).start()
        vals = {
            ("dur:%d" % i).encode(): os.urandom(i * 37 % 5000)
            for i in range(200)
        }
        try:
            r = srv.client()
            p = r.pipeline(transaction=False)
            for i, (k, v) in enumerate(vals.items()):
                if i % 2:
                    self.assertTrue(r.set(k, v))
                else:
                    p.set(k, v)
            self.assertTrue(all(p.execute()))
            r.close()
            srv.stop(signal.SIGKILL)
            srv.start()
            r = srv.client()
            self.assertEqual(r.dbsize(), 200)
            got = r.mget(list(vals))
            self.assertEqual(got, list(vals.values()))
            r.close()
        finally:
            srv.stop()
            shutil.rmtree(d, ignore_errors=True)

    def test_max_value(self):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        srv = Server("--resp-max-value", "1K", data_dir=d).start()
        try:
            self.assertEqual(
                raw(
                    srv.port,
                    b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n"
                    b"$1024\r\n" + b"x" * 1024 + b"\r\nGET k\r\n",
                ),
                b"+OK\r\n$1024\r\n" + b"x" * 1024 + b"\r\n",
            )
            self.assertEqual(
                raw(srv.port, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1025\r\n"),
                b"-ERR Protocol error: invalid bulk length\r\n<EOF>",
            )
        finally:
            srv.stop()
            shutil.rmtree(d, ignore_errors=True)


# ---- RESP3 (HELLO 3) ----


def resp3_frames(p, *cmds):
    """Sends HELLO 3 and cmds on one connection; the raw reply bytes."""
    data = b"HELLO 3\r\n" + b"".join(c + b"\r\n" for c in cmds)
    return raw(p, data)


class Resp3(ServerCase):
    """HELLO 3: the connection's replies switch to RESP3 (maps, `_` nil,
    verbatim INFO); HELLO 2 switches back. redis-py 4.3.4 has no RESP3
    client, so the frames are checked byte for byte on raw sockets (and
    with redis-py >= 5 when it is the one installed)."""

    def setUp(self):
        raw(self.srv.port, b"FLUSHDB\r\n", b"+OK\r\n")

    def test_hello_map(self):
        out = raw(self.srv.port, b"HELLO 3\r\n", b"%7")
        self.assertTrue(
            out.startswith(
                b"%7\r\n$6\r\nserver\r\n$5\r\nredis\r\n$7\r\nversion\r\n$5\r\n"
                b"7.0.0\r\n$5\r\nproto\r\n:3\r\n$2\r\nid\r\n:"
            ),
            out,
        )
        self.assertTrue(
            out.endswith(
                b"$4\r\nmode\r\n$10\r\nstandalone\r\n$4\r\nrole\r\n$6\r\nmaster"
                b"\r\n$7\r\nmodules\r\n*0\r\n"
            ),
            out,
        )
        # HELLO without a version answers in the protocol in force
        out = raw(self.srv.port, b"HELLO 3\r\nHELLO\r\nHELLO 2\r\nHELLO\r\n")
        self.assertEqual(out.count(b"%7\r\n"), 2)
        self.assertEqual(out.count(b"*14\r\n"), 2)
        self.assertEqual(out.count(b":3\r\n"), 2)
        self.assertEqual(out.count(b":2\r\n"), 2)

    def test_nil_and_maps(self):
        p = self.srv.port
        raw(p, b"SET a 1\r\nSET b 2\r\n", b"+OK\r\n+OK\r\n")
        out = resp3_frames(
            p,
            b"GET missing",
            b"MGET a missing",
            b"SET a x NX",
            b"SET new x XX GET",
            b"CLIENT GETNAME",
            b"CONFIG GET maxclients",
            b"COMMAND DOCS",
            b"TTL a",
            b"EXISTS a b",
            b"SCAN 0 MATCH nomatch*",
        )
        hello_end = out.index(b"*0\r\n") + 4  # HELLO's modules []
        self.assertEqual(
            out[hello_end:],
            b"_\r\n"
            b"*2\r\n$1\r\n1\r\n_\r\n"
            b"_\r\n"
            b"_\r\n"
            b"_\r\n"
            b"%1\r\n$10\r\nmaxclients\r\n$5\r\n10000\r\n"
            b"%0\r\n"
            b":-1\r\n"
            b":2\r\n"
            b"*2\r\n$1\r\n0\r\n*0\r\n",
        )
        # HELLO 2 on the same connection: RESP2 again
        out = raw(
            p,
            b"HELLO 3\r\nHELLO 2\r\nGET missing\r\nCONFIG GET maxclients\r\n",
        )
        self.assertTrue(
            out.endswith(b"$-1\r\n*2\r\n$10\r\nmaxclients\r\n$5\r\n10000\r\n"),
            out,
        )

    def test_info_verbatim_and_exec(self):
        p = self.srv.port
        out = resp3_frames(
            p,
            b"INFO keyspace",
            b"MULTI",
            b"SET k v",
            b"GET nope",
            b"EXEC",
            b"CLIENT INFO",
        )
        body = out[out.index(b"*0\r\n") + 4 :]
        self.assertTrue(
            body.startswith(b"=16\r\ntxt:# Keyspace\r\n\r\n"), body
        )
        self.assertIn(b"+OK\r\n+QUEUED\r\n+QUEUED\r\n*2\r\n+OK\r\n_\r\n", body)
        self.assertRegex(body, rb"=\d+\r\ntxt:id=\d+ .* resp=3\n\r\n$")

    def test_redis_py_protocol_3(self):
        try:
            r = self.srv.client(protocol=3)
        except TypeError:
            # not applicable, so a skip even when CI=true: Debian 12's
            # python3-redis (4.3.4) predates RESP3; the raw RESP3 frames
            # above are checked whatever redis-py is installed
            self.skipTest("redis-py %s has no RESP3" % redis.__version__)
        self.assertIsNone(r.get("nope"))
        self.assertTrue(r.set("k", b"v"))
        self.assertEqual(r.get("k"), b"v")
        self.assertIn("redis_version", r.info())
        r.close()


class Resp3Auth(unittest.TestCase):
    def test_hello_3_auth(self):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        toks, path = make_tokens(d)
        srv = Server("--tokens", path, data_dir=d).start()
        try:
            tok = toks["write"].encode()
            out = raw(
                srv.port, b"HELLO 3 AUTH default " + tok + b"\r\nGET nope\r\n"
            )
            self.assertTrue(out.startswith(b"%7\r\n"), out)
            self.assertTrue(out.endswith(b"*0\r\n_\r\n"), out)
            # a wrong token: the error, and the protocol stays RESP2
            out = raw(
                srv.port,
                b"HELLO 3 AUTH default nottoken\r\n"
                b"HELLO 3 AUTH writer " + tok + b"\r\nGET nope\r\n",
            )
            self.assertTrue(out.startswith(b"-WRONGPASS"), out)
            self.assertTrue(out.endswith(b"*0\r\n_\r\n"), out)
        finally:
            srv.stop()
            shutil.rmtree(d, ignore_errors=True)


def big_gets_reply(n, size):
    """The bytes n GETs of a size-byte value answer."""
    return n * (len(b"$%d\r\n" % size) + size + 2)


def pipelined_gets(sock, key, n, value):
    """Sends n GETs of key at once, then reads every reply (the server runs
    the buffered commands after draining its first replies, with no more
    input to wake it)."""
    cmd = b"*2\r\n$3\r\nGET\r\n$%d\r\n%s\r\n" % (len(key), key)
    sock.sendall(cmd * n)
    want = (b"$%d\r\n" % len(value) + value + b"\r\n") * n
    got = read_exactly(sock, len(want))
    return len(got), got == want


class LargePipelines(ServerCase):
    """Pipelined reads whose replies pass the output mark (1 MiB)."""

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.value = os.urandom(1 << 20)
        r = cls.srv.client()
        r.set("big:1m", cls.value)
        r.close()

    def test_pipelines_of_1mib_gets(self):
        for n in (3, 10, 50):
            with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
                got, same = pipelined_gets(s, b"big:1m", n, self.value)
                self.assertEqual(
                    got, big_gets_reply(n, len(self.value)), "%d GETs" % n
                )
                self.assertTrue(same, "%d GETs" % n)

    def test_large_gets_after_a_write(self):
        """The GETs wait for the SET's group commit, then run from the
        committer's return: past the mark they must go on too."""
        with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
            s.sendall(b"SET big:w 1\r\n" + b"GET big:1m\r\n" * 10)
            self.assertEqual(read_exactly(s, 5), b"+OK\r\n")
            want = big_gets_reply(10, len(self.value))
            self.assertEqual(len(read_exactly(s, want)), want)

    def test_pipeline_then_eof_is_answered(self):
        with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
            s.sendall(b"GET big:1m\r\n" * 5)
            s.shutdown(socket.SHUT_WR)
            got = read_exactly(s, big_gets_reply(5, len(self.value)) + 1)
            self.assertEqual(len(got), big_gets_reply(5, len(self.value)))

    def test_values_sent_from_the_map_survive_a_slow_reader(self):
        """GET replies of distinct values, more than one batch's writev
        takes from the map, to a reader that waits: what the first write
        did not send is copied before the round's read ends, so the bytes
        stay right while another connection overwrites and deletes the
        keys. The replies stay under the output mark (1 MiB): every GET
        runs before the keys change."""
        vals = [os.urandom(2048 + 600 * i) for i in range(40)]
        r = self.srv.client()
        for i, v in enumerate(vals):
            r.set("mv:%d" % i, v)
        order = [i % len(vals) for i in range(60)]
        want = b"".join(
            b"$%d\r\n%s\r\n" % (len(vals[i]), vals[i]) for i in order
        )
        with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            s.sendall(b"".join(b"GET mv:%d\r\n" % i for i in order))
            time.sleep(0.3)  # the server's writes stop at a full socket
            for i in range(len(vals)):
                r.set("mv:%d" % i, b"x" * 5000)
            r.delete(*["mv:%d" % i for i in range(len(vals))])
            got = read_exactly(s, len(want))
        r.close()
        self.assertEqual(len(got), len(want))
        self.assertTrue(got == want, "reply bytes differ")
        # one value larger than the socket takes at once (loopback: 4 MiB)
        big = os.urandom(12 << 20)
        r = self.srv.client()
        r.set("mv:big", big)
        with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 16 * 1024)
            s.sendall(b"GET mv:big\r\n")
            time.sleep(0.3)
            r.set("mv:big", b"y" * (12 << 20))
            r.delete("mv:big")
            want = b"$%d\r\n" % len(big) + big + b"\r\n"
            got = read_exactly(s, len(want))
        r.close()
        self.assertEqual(len(got), len(want))
        self.assertTrue(got == want, "reply bytes differ")

    def test_slow_reader_bounded_memory(self):
        """A client that pipelines 200 large GETs and reads slowly holds
        about the output mark in the server, not 200 MiB."""
        n = 200
        before = rss_anon_kib(self.srv.proc.pid)
        with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
            s.sendall(b"GET big:1m\r\n" * n)
            peak = 0
            for _ in range(10):
                read_exactly(s, 256 * 1024)
                time.sleep(0.1)
                peak = max(peak, rss_anon_kib(self.srv.proc.pid))
            self.assertLess(peak - before, 48 * 1024, (before, peak))
            rest = big_gets_reply(n, len(self.value)) - 10 * 256 * 1024
            self.assertEqual(len(read_exactly(s, rest)), rest)
        r = self.srv.client()
        self.assertTrue(r.ping())
        r.close()


def set_cmd(key, value):
    return (
        b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n"
        % (len(key), key, len(value))
        + value
        + b"\r\n"
    )


class BigInputBuffers(ServerCase):
    """Big values' input buffers come from a pool that values which
    really arrived left (server/resp/resp.c): a declared length borrows at
    most what is held already, allocates nothing, and one connection's bytes
    never show through another's."""

    def fill_pool(self):
        with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
            for i in range(4):
                s.sendall(set_cmd(b"pool:%d" % i, os.urandom(3 << 20)))
                self.assertEqual(read_exactly(s, 5), b"+OK\r\n")

    def test_declared_huge_bulks_do_not_grow_rss(self):
        """30 slow clients each declare a 500 MB value and send 64 KiB of
        it: the server holds about what arrived (plus the pool filled
        before), not 15 GB, and stays up."""
        self.fill_pool()
        pid = self.srv.proc.pid
        before = rss_anon_kib(pid)
        vm_before = rss_anon_kib(pid, "VmData:")
        socks = []
        try:
            for _ in range(30):
                s = socket.create_connection(("127.0.0.1", self.srv.port))
                s.sendall(b"*3\r\n$3\r\nSET\r\n$4\r\nhuge\r\n$500000000\r\n")
                socks.append(s)
            for _ in range(4):
                for s in socks:
                    s.sendall(b"y" * 16384)
                time.sleep(0.1)
            time.sleep(0.3)
            grown = rss_anon_kib(pid) - before
            # 30 x 64 KiB arrived: at most ~2x that in buffers, resident
            # and allocated (an allocation of the declared size would
            # show in VmData even untouched)
            self.assertLess(grown, 16 * 1024, (before, grown))
            vm_grown = rss_anon_kib(pid, "VmData:") - vm_before
            self.assertLess(vm_grown, 64 * 1024, (vm_before, vm_grown))
            r = self.srv.client()
            self.assertTrue(r.ping())
            self.assertIsNone(r.get("huge"))
            r.close()
        finally:
            for s in socks:
                s.close()

    def test_interleaved_big_sets_never_mix(self):
        """Two connections send big values in interleaved pieces (their
        buffers taken from and returned to the pool in between), then
        pipelined big SETs of shrinking sizes (a pooled buffer holds an
        older, longer value's bytes past the new one); every GET is
        byte-exact."""
        self.fill_pool()
        vals = {}
        a = socket.create_connection(("127.0.0.1", self.srv.port))
        b = socket.create_connection(("127.0.0.1", self.srv.port))
        try:
            for rnd in range(3):
                ka, kb = b"mix:a%d" % rnd, b"mix:b%d" % rnd
                va = os.urandom((1 << 20) + 17 * rnd)
                vb = os.urandom((3 << 19) - 5 * rnd)
                ca, cb = set_cmd(ka, va), set_cmd(kb, vb)
                step = 100000
                for off in range(0, max(len(ca), len(cb)), step):
                    a.sendall(ca[off : off + step])
                    b.sendall(cb[off : off + step])
                    time.sleep(0.005)
                self.assertEqual(read_exactly(a, 5), b"+OK\r\n")
                self.assertEqual(read_exactly(b, 5), b"+OK\r\n")
                vals[ka], vals[kb] = va, vb
            # shrinking values pipelined on one connection, a short SET
            # of a value that is a prefix of nothing held
            big = [os.urandom(n) for n in (2 << 20, 1 << 20, 300000, 70000)]
            a.sendall(
                b"".join(set_cmd(b"mix:s%d" % i, v) for i, v in enumerate(big))
            )
            self.assertEqual(
                read_exactly(a, 5 * len(big)), b"+OK\r\n" * len(big)
            )
            for i, v in enumerate(big):
                vals[b"mix:s%d" % i] = v
            b.sendall(set_cmd(b"mix:short", b"z" * 5))
            self.assertEqual(read_exactly(b, 5), b"+OK\r\n")
            vals[b"mix:short"] = b"z" * 5
        finally:
            a.close()
            b.close()
        r = self.srv.client()
        for k, v in vals.items():
            self.assertEqual(r.get(k), v, k)
        r.close()

    def test_same_bytes_again_under_other_keys(self):
        """One big value under several keys (one blob), and a value that
        differs from it in a single byte inside: each key holds exactly its
        own bytes, and a SET of what a key holds is settled."""
        r = self.srv.client()
        v = os.urandom(200000)
        w = bytearray(v)
        w[1000] ^= 1
        w = bytes(w)
        for i in range(4):
            self.assertTrue(r.set("again:%d" % i, v))
        self.assertTrue(r.set("again:w", w))
        self.assertTrue(r.set("again:0", w))
        self.assertEqual(r.get("again:w"), w)
        self.assertEqual(r.get("again:0"), w)
        for i in range(1, 4):
            self.assertEqual(r.get("again:%d" % i), v)
        before = settled(self.srv)
        self.assertTrue(r.set("again:1", v))  # the same: settled
        self.assertEqual(settled(self.srv) - before, 1)
        self.assertEqual(r.get("again:1"), v)
        r.close()

    def test_settled_sets_of_repetitive_values(self):
        """A SET of what a key holds compressed (a repetitive value,
        compared through its frame) is settled; a SET of a value that
        differs only in its last byte is not, and is stored."""
        r = self.srv.client()
        v = b"x" * (1 << 20)
        r.set("rep", v)
        before = settled(self.srv)
        for _ in range(3):
            self.assertTrue(r.set("rep", v))
        self.assertEqual(settled(self.srv) - before, 3)
        self.assertEqual(r.get("rep"), v)
        w = v[:-1] + b"y"
        self.assertTrue(r.set("rep", w))
        self.assertEqual(r.get("rep"), w)
        u = v[:-1]  # one byte shorter: the size alone differs
        self.assertTrue(r.set("rep", u))
        self.assertEqual(r.get("rep"), u)
        self.assertEqual(settled(self.srv) - before, 3)  # w, u: stored
        r.close()


# ---- TLS ----


def openssl(*args, cwd):
    subprocess.run(
        ["openssl"] + list(args), cwd=cwd, check=True, capture_output=True
    )


def make_pki(d):
    """A root CA, an intermediate, and a server certificate for 127.0.0.1
    signed by the intermediate; the server's PEM holds leaf + intermediate
    (the chain), clients trust the root only. (ca.pem, cert.pem, key.pem)"""
    ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ]
    with open(os.path.join(d, "ca.ext"), "w") as f:
        f.write(
            "basicConstraints=critical,CA:TRUE\n"
            "keyUsage=critical,keyCertSign,cRLSign\n"
        )
    with open(os.path.join(d, "leaf.ext"), "w") as f:
        f.write(
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
            "extendedKeyUsage=serverAuth\n"
        )
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
        "-days",
        "2",
        "-subj",
        "/CN=kcache test root",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )
    openssl(
        "req",
        *ec,
        "-keyout",
        "int.key",
        "-out",
        "int.csr",
        "-subj",
        "/CN=kcache test intermediate",
        cwd=d,
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "int.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "int.pem",
        "-days",
        "2",
        "-extfile",
        "ca.ext",
        cwd=d,
    )
    openssl(
        "req",
        *ec,
        "-keyout",
        "key.pem",
        "-out",
        "leaf.csr",
        "-subj",
        "/CN=127.0.0.1",
        cwd=d,
    )
    openssl(
        "x509",
        "-req",
        "-in",
        "leaf.csr",
        "-CA",
        "int.pem",
        "-CAkey",
        "int.key",
        "-CAcreateserial",
        "-out",
        "leaf.pem",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
        cwd=d,
    )
    with open(os.path.join(d, "cert.pem"), "wb") as f:
        for part in ("leaf.pem", "int.pem"):
            with open(os.path.join(d, part), "rb") as g:
                f.write(g.read())
    os.chmod(os.path.join(d, "key.pem"), 0o600)
    return [os.path.join(d, n) for n in ("ca.pem", "cert.pem", "key.pem")]


def tls_raw(port, ca, data, end):
    """raw() over TLS: sends data, reads until the reply ends with end."""
    import ssl

    ctx = ssl.create_default_context(cafile=ca)
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
            t.sendall(data)
            out = b""
            while not out.endswith(end):
                d = t.recv(1 << 20)
                if not d:
                    break
                out += d
            return out


class Tls(unittest.TestCase):
    """--tls-cert/--tls-key: RESP speaks TLS (rediss://) with the same
    certificate as HTTPS; plaintext clients fail, the server keeps
    serving."""

    @classmethod
    def setUpClass(cls):
        cls.d = tempfile.mkdtemp(prefix="kc-resp-")
        cls.toks, path = make_tokens(cls.d)
        cls.ca, cls.cert, cls.key = make_pki(cls.d)
        cls.srv = Server(
            "--tokens",
            path,
            "--tls-cert",
            cls.cert,
            "--tls-key",
            cls.key,
            "--metrics-role",
            "none",
            data_dir=cls.d,
        ).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.d, ignore_errors=True)

    def url(self, role="write"):
        return "rediss://:%s@127.0.0.1:%d" % (self.toks[role], self.srv.port)

    def client(self):
        return redis.Redis.from_url(self.url(), ssl_ca_certs=self.ca)

    def metrics(self):
        import ssl

        with open(os.path.join(self.d, "http-port")) as f:
            port = int(f.read())
        ctx = ssl.create_default_context(cafile=self.ca)
        with urllib.request.urlopen(
            "https://127.0.0.1:%d/metrics" % port, timeout=10, context=ctx
        ) as resp:
            return resp.read().decode()

    def test_rediss_round_trip(self):
        r = self.client()
        self.assertIsNone(r.get("tls:missing"))
        self.assertTrue(r.set("tls:k", b"v", ex=100))
        self.assertEqual(r.get("tls:k"), b"v")
        # values over many TLS records, both ways, and a pipeline
        big = os.urandom(3 << 20)
        self.assertTrue(r.set("tls:big", big))
        self.assertEqual(r.get("tls:big"), big)
        p = r.pipeline(transaction=False)
        for i in range(500):
            p.set("tls:%d" % i, b"%d" % i)
            p.get("tls:%d" % i)
        got = p.execute()
        self.assertEqual(got[1::2], [b"%d" % i for i in range(500)])
        self.assertEqual(r.mget(["tls:big", "tls:nope"]), [big, None])
        r.close()

    def test_many_tls_clients_at_once(self):
        errors = []

        def worker(n):
            try:
                r = self.client()
                for i in range(50):
                    v = os.urandom(100 + i * 997)
                    r.set("tls:w%d:%d" % (n, i), v)
                    if r.get("tls:w%d:%d" % (n, i)) != v:
                        errors.append("mismatch")
                r.close()
            except Exception as e:  # a thread must report, not die
                errors.append(repr(e))

        ts = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
        self.assertEqual(errors, [])

    def test_plaintext_client_fails_cleanly(self):
        before = self.metrics()
        plain = redis.Redis(
            host="127.0.0.1",
            port=self.srv.port,
            password=self.toks["write"],
            socket_timeout=5,
        )
        with self.assertRaises(redis.exceptions.ConnectionError):
            plain.ping()
        plain.close()
        try:  # closed, maybe with a reset (the PING was left unread)
            out = raw(self.srv.port, b"PING\r\n")
            self.assertTrue(out.endswith(b"<EOF>"), out)
            self.assertNotIn(b"PONG", out)
        except ConnectionResetError:
            pass
        # the server goes on serving TLS clients
        r = self.client()
        self.assertTrue(r.ping())
        r.close()

        def failures(text):
            for line in text.splitlines():
                if line.startswith(
                    "kcached_resp_tls_handshake_failures_total"
                ):
                    return int(line.split()[-1])
            self.fail("no kcached_resp_tls_handshake_failures_total")

        self.assertGreaterEqual(failures(self.metrics()), failures(before) + 2)

    def test_pipelined_large_gets_over_tls(self):
        import ssl

        r = self.client()
        value = os.urandom(1 << 20)
        r.set("tls:1m", value)
        r.close()
        ctx = ssl.create_default_context(cafile=self.ca)
        tok = self.toks["read"].encode()
        for n in (3, 10, 50):
            with socket.create_connection(("127.0.0.1", self.srv.port)) as s:
                with ctx.wrap_socket(s, server_hostname="127.0.0.1") as t:
                    t.sendall(b"AUTH " + tok + b"\r\n")
                    self.assertEqual(read_exactly(t, 5), b"+OK\r\n")
                    got, same = pipelined_gets(t, b"tls:1m", n, value)
                    self.assertEqual(
                        got, big_gets_reply(n, len(value)), "%d GETs" % n
                    )
                    self.assertTrue(same)

    def test_resp3_over_tls(self):
        tok = self.toks["read"].encode()
        want_end = b"*0\r\n_\r\n"
        out = tls_raw(
            self.srv.port,
            self.ca,
            b"HELLO 3 AUTH default " + tok + b"\r\nGET tls:none\r\n",
            want_end,
        )
        self.assertTrue(out.startswith(b"%7\r\n"), out)
        self.assertTrue(out.endswith(want_end), out)

    def test_silent_client_is_dropped_after_handshake_timeout(self):
        s = socket.create_connection(("127.0.0.1", self.srv.port))
        s.settimeout(20)
        t0 = time.time()
        self.assertEqual(s.recv(100), b"")  # closed by the server
        took = time.time() - t0
        s.close()
        self.assertGreater(took, 8)
        self.assertLess(took, 15)


class TlsOffForResp(unittest.TestCase):
    """--resp-tls off: HTTP stays HTTPS, RESP speaks plaintext (Triton's
    redis.Redis(host, port) on the same kcached)."""

    @classmethod
    def setUpClass(cls):
        cls.d = tempfile.mkdtemp(prefix="kc-resp-")
        cls.toks, path = make_tokens(cls.d)
        cls.ca, cls.cert, cls.key = make_pki(cls.d)
        cls.srv = Server(
            "--tokens",
            path,
            "--tls-cert",
            cls.cert,
            "--tls-key",
            cls.key,
            "--resp-tls",
            "off",
            "--resp-anonymous-role",
            "write",
            "--metrics-role",
            "none",
            data_dir=cls.d,
        ).start()

    @classmethod
    def tearDownClass(cls):
        cls.srv.stop()
        shutil.rmtree(cls.d, ignore_errors=True)

    def test_plain_resp_beside_https(self):
        import ssl

        r = redis.Redis(host="127.0.0.1", port=self.srv.port)
        self.assertTrue(r.set("triton:k", b"v"))
        self.assertEqual(r.get("triton:k"), b"v")
        r.close()
        r = redis.Redis(
            host="127.0.0.1", port=self.srv.port, password=self.toks["read"]
        )
        self.assertEqual(r.get("triton:k"), b"v")
        r.close()
        with open(os.path.join(self.d, "http-port")) as f:
            port = int(f.read())
        ctx = ssl.create_default_context(cafile=self.ca)
        with urllib.request.urlopen(
            "https://127.0.0.1:%d/metrics" % port, timeout=10, context=ctx
        ) as resp:
            self.assertIn(b"kcached_resp_", resp.read())
        with self.assertRaises(Exception):  # HTTP is not plaintext
            urllib.request.urlopen(
                "http://127.0.0.1:%d/metrics" % port, timeout=5
            ).read()

    def test_tls_client_fails(self):
        import ssl

        ctx = ssl.create_default_context(cafile=self.ca)
        with socket.create_connection(("127.0.0.1", self.srv.port), 5) as s:
            with self.assertRaises((ssl.SSLError, OSError)):
                ctx.wrap_socket(s, server_hostname="127.0.0.1")


class TlsConfig(unittest.TestCase):
    """Off loopback, RESP with --tokens needs TLS or --allow-plaintext."""

    def run_kcached(self, d, *extra):
        return subprocess.Popen(
            [
                kcharness.kcached_path(),
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                os.path.join(d, "data"),
                "--resp-listen",
                "0.0.0.0:0",
            ]
            + list(extra),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )

    def test_plaintext_refused_tls_accepted(self):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        try:
            toks, path = make_tokens(d)
            ca, cert, key = make_pki(d)
            p = self.run_kcached(d, "--tokens", path)
            out = p.communicate(timeout=30)[0]
            self.assertEqual(p.returncode, 2, out)
            self.assertIn(b"--allow-plaintext", out)
            p = self.run_kcached(
                d, "--tokens", path, "--tls-cert", cert, "--tls-key", key
            )
            time.sleep(1.5)
            self.assertIsNone(p.poll(), p.stdout.read() if p.poll() else "")
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=30)
        finally:
            shutil.rmtree(d, ignore_errors=True)

    def test_resp_tls_off_needs_allow_plaintext(self):
        d = tempfile.mkdtemp(prefix="kc-resp-")
        try:
            toks, path = make_tokens(d)
            ca, cert, key = make_pki(d)
            tls = ["--tokens", path, "--tls-cert", cert, "--tls-key", key]
            p = self.run_kcached(d, *tls, "--resp-tls", "off")
            out = p.communicate(timeout=30)[0]
            self.assertEqual(p.returncode, 2, out)
            self.assertIn(b"--allow-plaintext", out)
            p = self.run_kcached(d, "--resp-tls", "on")  # no certificate
            out = p.communicate(timeout=30)[0]
            self.assertEqual(p.returncode, 2, out)
            self.assertIn(b"--resp-tls on", out)
            p = self.run_kcached(
                d, *tls, "--resp-tls", "off", "--allow-plaintext"
            )
            time.sleep(1.5)
            self.assertIsNone(p.poll(), p.stdout.read() if p.poll() else "")
            p.send_signal(signal.SIGTERM)
            p.communicate(timeout=30)
        finally:
            shutil.rmtree(d, ignore_errors=True)


# ---- observability ----


class Observability(unittest.TestCase):
    """/metrics (per key family reads, bytes, connections, batch sizes,
    commit errors), INFO's true figures, /v1/stats's RESP side."""

    def setUp(self):
        self.srv = Server("--max-bytes", "4M").start()
        self.r = self.srv.client()

    def tearDown(self):
        self.r.close()
        self.srv.stop()
        shutil.rmtree(self.srv.dir, ignore_errors=True)

    def stats(self):
        import json

        with urllib.request.urlopen(
            "http://127.0.0.1:%d/v1/stats" % self.srv.http_port(), timeout=10
        ) as resp:
            return json.loads(resp.read())

    def test_reads_per_key_family(self):
        r = self.r
        self.assertIsNone(r.get("pt2:a"))
        r.set("pt2:a", "1")
        self.assertEqual(r.get("pt2:a"), b"1")
        self.assertEqual(
            r.mget(["triton:x", "pt2:a", "nocolon"]), [None, b"1", None]
        )
        r.exists("pt2:a")  # not a value read: not counted
        # 40 more families: the table learns 32 in all, the rest is other
        for i in range(40):
            r.get("fam%02d:k" % i)
        t = self.srv.metrics()
        name = "kcached_resp_key_reads_total"
        self.assertEqual(metric(t, name, 'family="pt2",result="hit"'), 2)
        self.assertEqual(metric(t, name, 'family="pt2",result="miss"'), 1)
        self.assertEqual(metric(t, name, 'family="triton",result="miss"'), 1)
        self.assertEqual(metric(t, name, 'family="triton",result="hit"'), 0)
        self.assertEqual(metric(t, name, 'family="fam29",result="miss"'), 1)
        self.assertIsNone(metric(t, name, 'family="fam30",result="miss"'))
        # nocolon and fam30..fam39
        self.assertEqual(metric(t, name, 'family="other",result="miss"'), 11)
        families = {
            l.split('family="')[1].split('"')[0]
            for l in t.splitlines()
            if l.startswith(name + "{")
        }
        self.assertEqual(len(families), 33)

    def test_bytes_connections_batches(self):
        t0 = self.srv.metrics()
        r = self.r
        r.set("k", b"x" * 10000)
        self.assertEqual(len(r.get("k")), 10000)
        raw(self.srv.port, b"SET a 1\r\nSET b 2\r\nSET c 3\r\n", b"+OK" * 3)
        t = self.srv.metrics()
        self.assertGreaterEqual(
            metric(t, "kcached_resp_received_bytes_total")
            - metric(t0, "kcached_resp_received_bytes_total"),
            10000,
        )
        self.assertGreaterEqual(
            metric(t, "kcached_resp_sent_bytes_total")
            - metric(t0, "kcached_resp_sent_bytes_total"),
            10000,
        )
        self.assertGreaterEqual(metric(t, "kcached_resp_connections_total"), 2)
        self.assertGreaterEqual(metric(t, "kcached_resp_connections"), 1)
        n = metric(t, "kcached_resp_commit_batch_ops_count")
        self.assertGreaterEqual(n, 2)
        self.assertEqual(
            metric(t, "kcached_resp_commit_batch_ops_bucket", 'le="+Inf"'), n
        )
        self.assertGreaterEqual(
            metric(t, "kcached_resp_commit_batch_ops_sum"), 4
        )
        # the three pipelined SETs of one read went in one commit of 3 ops
        self.assertGreaterEqual(
            metric(t, "kcached_resp_commit_batch_ops_bucket", 'le="5"')
            - metric(t, "kcached_resp_commit_batch_ops_bucket", 'le="2"'),
            1,
        )
        self.assertEqual(metric(t, "kcached_resp_commit_errors_total"), 0)

    def test_failed_write_counts_as_error(self):
        t0 = self.srv.metrics()
        with self.assertRaises(redis.exceptions.ResponseError):
            self.r.set("big", os.urandom(6 << 20))  # over --max-bytes
        self.assertTrue(self.r.set("small", b"1"))
        t = self.srv.metrics()
        name = "kcached_resp_commands_total"
        self.assertEqual(
            metric(t, name, 'cmd="set",result="error"')
            - metric(t0, name, 'cmd="set",result="error"'),
            1,
        )
        self.assertEqual(
            metric(t, name, 'cmd="set",result="ok"')
            - metric(t0, name, 'cmd="set",result="ok"'),
            1,
        )

    def test_info_true_figures(self):
        r = self.r
        for i in range(30):
            r.set("e:%d" % i, "v", ex=1000)
        for i in range(20):
            r.set("p:%d" % i, "v")
        r.persist("e:0")
        r.expire("p:0", 500)
        ks = r.info("keyspace")["db0"]
        self.assertEqual((ks["keys"], ks["expires"]), (50, 30))
        r.delete("e:1")
        self.assertEqual(r.info("keyspace")["db0"]["expires"], 29)
        mem = r.info("memory")
        self.assertGreater(mem["used_memory_rss"], 1 << 20)
        self.assertEqual(mem["used_memory"], 49)  # 1-byte values
        other = self.srv.client()
        other.ping()
        self.assertEqual(r.info("clients")["connected_clients"], 2)
        other.close()
        srv = r.info("server")
        self.assertEqual(srv["tcp_port"], self.srv.port)
        self.assertEqual(srv["process_id"], self.srv.proc.pid)
        self.assertGreater(r.info("stats")["total_net_input_bytes"], 0)

    def test_stats_both_sides(self):
        r = self.r
        r.set("s:1", b"x" * 1000, ex=100)
        r.set("s:2", b"y" * 500)
        r.get("s:1")
        r.get("s:nope")
        st = self.stats()
        self.assertEqual(st["kv_keys"], 2)
        self.assertEqual(st["kv_expires"], 1)
        self.assertEqual(st["kv_bytes"], 1500)
        self.assertEqual(st["kv_hits"], 1)
        self.assertEqual(st["kv_misses"], 1)
        self.assertEqual(st["evicted_kv"], 0)
        self.assertEqual(st["kv_max_bytes"], 0)
        self.assertGreaterEqual(st["resp_clients"], 1)
        # bytes_used counts stored bytes: these values are held compressed
        # (zstd); bytes_raw counts their content
        self.assertGreaterEqual(st["bytes_raw"], 1500)
        self.assertLessEqual(st["bytes_used"], st["bytes_raw"])
        self.assertEqual(st["bundles"], 0)

    def test_stats_key_families(self):
        """/v1/stats's resp_families: the reads per key family, as
        /metrics counts them; a family name of odd bytes stays a string."""
        r = self.r
        self.assertEqual(
            self.stats()["resp_families"],
            [{"family": "other", "hits": 0, "misses": 0}],
        )
        r.set("pt2:a", "1")
        r.set("triton:m1", "2")
        self.assertEqual(r.get("pt2:a"), b"1")
        self.assertIsNone(r.get("pt2:b"))
        self.assertEqual(
            r.mget(["pt2:a", "triton:m1", "triton:m2", "nocolon"]),
            [b"1", b"2", None, None],
        )
        hostile = '<img/src=x/onerror="x">'  # '"' in it: counts as other
        r.get(hostile + ":k")
        r.get("<b>&amp;:k")  # printable: its own family, sent as JSON text
        fams = self.stats()["resp_families"]
        self.assertEqual(
            fams,
            [
                {"family": "pt2", "hits": 2, "misses": 1},
                {"family": "triton", "hits": 1, "misses": 1},
                {"family": "<b>&amp;", "hits": 0, "misses": 1},
                {"family": "other", "hits": 0, "misses": 2},
            ],
        )


if __name__ == "__main__":
    kcharness.main_with_kcached(__doc__)
