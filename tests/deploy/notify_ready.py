#!/usr/bin/env python3
"""notify_ready.py: kcached speaks the sd_notify protocol as Type=notify needs.

Binds a unix datagram socket, starts KCACHED with NOTIFY_SOCKET pointing at it
and `--listen 127.0.0.1:0 --data-dir <tmp> --port-file <tmp>`, and checks:
READY=1 arrives, and by then kcached listens (GET /healthz answers 200);
SIGTERM brings STOPPING=1 and a clean exit.

Usage: notify_ready.py KCACHED [--abstract]
"""

import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

START_S = 30  # generous: sanitizer builds start slowly
STOP_S = 30


def fail(msg, proc=None, log=None):
    print("FAIL: " + msg)
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    if log is not None:
        log.seek(0)
        tail = log.read().decode("utf-8", "replace")[-4000:]
        print("--- kcached output ---\n" + tail)
    return 1


def wait_state(sock, proc, want, seconds):
    """Reads datagrams until one has the line `want`; None on timeout, or once
    the process has exited and nothing is left to read."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        r, _, _ = select.select([sock], [], [], 0.2)
        if r:
            msg = sock.recv(4096).decode("utf-8", "replace")
            if want in msg.split("\n"):
                return msg
        elif proc.poll() is not None:
            return None
    return None


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    kcached = os.path.abspath(sys.argv[1])
    abstract = "--abstract" in sys.argv[2:]
    tmp = tempfile.mkdtemp(prefix="kcache-notify-")
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        if abstract:
            name = "@kcache-notify-%d-%s" % (
                os.getpid(),
                os.path.basename(tmp),
            )
            sock.bind("\0" + name[1:])
        else:
            name = os.path.join(tmp, "notify")
            sock.bind(name)
        return check(kcached, tmp, sock, name)
    finally:
        sock.close()
        shutil.rmtree(tmp, ignore_errors=True)


def check(kcached, tmp, sock, name):
    port_file = os.path.join(tmp, "port")
    env = dict(os.environ, NOTIFY_SOCKET=name)
    for k in list(env):
        if k.startswith("KCACHED_"):
            del env[k]  # only the flags below
    args = [
        kcached,
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        os.path.join(tmp, "data"),
        "--port-file",
        port_file,
    ]
    log = tempfile.TemporaryFile(dir=tmp)
    proc = subprocess.Popen(
        args,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )

    t0 = time.monotonic()
    if wait_state(sock, proc, "READY=1", START_S) is None:
        if proc.poll() is not None:
            return fail(
                "kcached exited with %d before READY=1" % proc.returncode,
                None,
                log,
            )
        return fail(
            'no READY=1 within %d s (NOTIFY_SOCKET=%s); is kcd_sd_notify("READY=1") '
            "wired into kcached's main after it listens?" % (START_S, name),
            proc,
            log,
        )
    print("ok: READY=1 after %.2f s" % (time.monotonic() - t0))

    # READY=1 promises a listening server: no retries here
    try:
        with open(port_file) as f:
            port = int(f.read().strip())
    except (OSError, ValueError) as e:
        return fail(
            "READY=1 came before the port file was written: %s" % e, proc, log
        )
    try:
        with urllib.request.urlopen(
            "http://127.0.0.1:%d/healthz" % port, timeout=5
        ) as r:
            status = r.status
    except Exception as e:  # noqa: BLE001 (any failure is the finding)
        return fail(
            "READY=1 sent but GET /healthz on port %d failed: %s" % (port, e),
            proc,
            log,
        )
    if status != 200:
        return fail("GET /healthz: %d" % status, proc, log)
    print("ok: listening on 127.0.0.1:%d, /healthz 200" % port)

    proc.send_signal(signal.SIGTERM)
    if wait_state(sock, proc, "STOPPING=1", STOP_S) is None:
        return fail(
            'no STOPPING=1 after SIGTERM; is kcd_sd_notify("STOPPING=1") '
            "wired into the shutdown path?",
            proc,
            log,
        )
    try:
        rc = proc.wait(timeout=STOP_S)
    except subprocess.TimeoutExpired:
        return fail("still running %d s after SIGTERM" % STOP_S, proc, log)
    if rc != 0:
        return fail("exit status %d after SIGTERM" % rc, None, log)
    print("ok: STOPPING=1, exit 0")
    return 0


if __name__ == "__main__":
    sys.exit(main())
