"""kcserver.py: the Python package's tests and the torch bench: kcached as
tests/kcharness.py starts it (Kcached, with 4 threads: start_kcached), and
torch_worker.py processes (run_worker).
"""

import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "torch_worker.py")
sys.path.insert(0, os.path.dirname(HERE))
import kcharness  # noqa: E402
from kcharness import free_port  # noqa: E402,F401  (for the tests)


def start_kcached(tokens=False, anonymous_role=None):
    """A started kcached: HTTP (url) and RESP (resp_url) on loopback, a
    temporary store; tokens=True: read, write and admin tokens (.tokens)."""
    return kcharness.Kcached(
        tokens=tokens,
        anonymous_role=anonymous_role,
        threads=4,
        prefix="kc-py-",
    ).start()


def run_script(script, args, env_extra, python=None, timeout=600, check=True):
    """Runs a worker script in a fresh process; returns its RESULT dict
    (the line "RESULT {json}" it prints), with its stderr's tail. A value
    None in env_extra removes that variable."""
    env = dict(os.environ)
    env.update(env_extra)
    for k in [k for k, v in env.items() if v is None]:
        del env[k]
    env["KCACHE_T0"] = repr(time.time())
    env.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
    p = subprocess.run(
        [python or sys.executable, script] + list(args),
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["stderr"] = p.stderr[-4000:]
            return r
    if check:
        raise AssertionError(
            "worker failed (rc %d):\n%s\n%s"
            % (p.returncode, p.stdout[-3000:], p.stderr[-6000:])
        )
    return None


def run_worker(path, env_extra, args=(), python=None, timeout=600, check=True):
    """Runs torch_worker.py in a fresh process; returns its RESULT dict."""
    return run_script(
        WORKER,
        ["--path", path] + list(args),
        env_extra,
        python,
        timeout,
        check,
    )
