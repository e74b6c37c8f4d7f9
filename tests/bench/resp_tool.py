#!/usr/bin/env python3
"""resp_tool.py: helpers of bench_resp.sh that redis-benchmark cannot do.

  fill PORT COUNT SIZE
      SETs COUNT keys fill:NNNNNNNN of SIZE bytes each, every value distinct
      (redis-benchmark sends the same bytes every time, which kcached stores
      once: content-addressed blobs). Pipelined over one connection, 4 MiB a
      batch. Prints "bytes seconds".
  randkeys PORT COUNT SIZE
      SETs redis-benchmark's keys key:000000000000 .. key:COUNT-1 (its -r
      keyspace) to random (incompressible) values of SIZE bytes, so that a
      redis-benchmark -t get -r COUNT that follows reads random payloads
      (redis-benchmark itself sends the same printable bytes every time).
      Pipelined over one connection. Prints "bytes seconds".
  firstget PIDFILE SIZE INDEX PORT -- COMMAND...
      Starts COMMAND (a server listening on PORT), writes its pid to PIDFILE,
      sends GET fill:INDEX until a whole value comes back (a refused
      connection or Redis's -LOADING reply means: again 1 ms later), checks the
      bytes, reads the server's VmRSS, stops it (SIGTERM) and prints
      "ms_to_first_value rss_kib".

Plain sockets, no redis-py: nothing to install. Values are deterministic
(a seeded random buffer, sliced per key, the key's number in front), so a
value read after a restart is checked against what was written.
"""

import os
import random
import signal
import socket
import struct
import subprocess
import sys
import time

_BASE = random.Random(13).randbytes(16 << 20)


def value(i, size):
    off = (i * 4099) % (len(_BASE) - size)
    return struct.pack(">Q", i) + _BASE[off : off + size - 8]


def cmd(*args):
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += [b"$%d\r\n" % len(a), a, b"\r\n"]
    return b"".join(out)


class Reader:
    def __init__(self, sock):
        self.s, self.buf = sock, bytearray()

    def _fill(self):
        chunk = self.s.recv(1 << 20)
        if not chunk:
            raise ConnectionError("closed")
        self.buf += chunk

    def line(self):
        while True:
            i = self.buf.find(b"\r\n")
            if i >= 0:
                ln = bytes(self.buf[:i])
                del self.buf[: i + 2]
                return ln
            self._fill()

    def exact(self, n):
        while len(self.buf) < n + 2:
            self._fill()
        v = bytes(self.buf[:n])
        del self.buf[: n + 2]
        return v

    def reply(self):
        ln = self.line()
        if ln[:1] == b"$":
            n = int(ln[1:])
            return None if n < 0 else self.exact(n)
        if ln[:1] == b"-":
            return RuntimeError(ln[1:].decode(errors="replace"))
        return ln


def fill(port, count, size, key="fill:%08d", val=None):
    val = val or value
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    r = Reader(s)
    batch = max(1, (4 << 20) // size)
    t0 = time.monotonic()
    for start in range(0, count, batch):
        n = min(batch, count - start)
        s.sendall(
            b"".join(
                cmd("SET", key % (start + k), val(start + k, size))
                for k in range(n)
            )
        )
        for _ in range(n):
            rep = r.reply()
            if rep != b"+OK":
                sys.exit("fill: SET answered %r" % (rep,))
    print(count * size, "%.3f" % (time.monotonic() - t0))


def rss_kib(pid):
    with open("/proc/%d/status" % pid) as f:
        for ln in f:
            if ln.startswith("VmRSS:"):
                return int(ln.split()[1])
    return -1


def try_get(port, key):
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
    except OSError:
        return None
    with s:
        s.sendall(cmd("GET", key))
        try:
            rep = Reader(s).reply()
        except (OSError, ConnectionError):
            return None
    return None if isinstance(rep, RuntimeError) else rep


def firstget(pidfile, size, index, port, argv):
    t0 = time.monotonic()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL)
    with open(pidfile, "w") as f:
        f.write("%d\n" % p.pid)
    key, want = "fill:%08d" % index, value(index, size)
    while True:
        got = try_get(port, key)
        if got is not None:
            break
        if p.poll() is not None or time.monotonic() - t0 > 600:
            sys.exit("firstget: no value from %s" % argv[0])
        time.sleep(0.001)
    ms = (time.monotonic() - t0) * 1000
    rss = rss_kib(p.pid)
    if got != want:
        sys.exit("firstget: wrong bytes for %s after restart" % key)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=120)
    os.unlink(pidfile)
    print("%.1f" % ms, rss)


def main():
    a = sys.argv[1:]
    if a[:1] == ["fill"] and len(a) == 4:
        return fill(int(a[1]), int(a[2]), int(a[3]))
    if a[:1] == ["randkeys"] and len(a) == 4:
        return fill(
            int(a[1]),
            int(a[2]),
            int(a[3]),
            "key:%012d",
            lambda i, size: os.urandom(size),
        )
    if a[:1] == ["firstget"] and len(a) > 6 and a[5] == "--":
        return firstget(a[1], int(a[2]), int(a[3]), int(a[4]), a[6:])
    sys.exit(__doc__)


if __name__ == "__main__":
    main()
