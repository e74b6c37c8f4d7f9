#!/usr/bin/env python3
"""bench_aot.py: time from process spawn to the first output of a service,
per path, on the test model ("pair": torch_worker.py's MLP and attention
block) and on a transformers GPT-2 built from a tiny config ("gpt2"), each
sample a fresh process with a fresh $TMPDIR and empty local caches,
interleaved (run 1 of every path and model, then run 2...), medians.
A real kcached is started here; the artifacts are published to it first
(kcache.torch.aot.publish, as CI would), and torch's own local cache
directory is filled once per model by a cold run (then copied for each
"local" sample, the copy not timed).

Paths:
  eager   `import torch`, build the model, call it: the floor
  cold    torch.compile, no caches
  local   torch.compile with torch's own full local cache dir
  aot     kcache.torch.compile: the artifacts fetched from kcached, loaded
          through torch's C++ loader (AOTIModelPackageLoader)
  aot-py  the same, loaded through torch._inductor.aoti_load_package
          (KCACHE_AOT_LOADER=python: imports Inductor)

usage: build/venv/bin/python tests/bench/bench_aot.py [--runs 3]
       [--models pair,gpt2] [--paths eager,cold,local,aot,aot-py]
(PYTHONPATH=python, KCACHE_LIB and KCACHED as for the tests.)
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
os.environ.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
import kcserver  # noqa: E402

WORKER = os.path.join(ROOT, "tests", "python", "aot_worker.py")
BUCKETS = "4,16"


def spawn(url, model, mode, extra_env=None, args=()):
    """One fresh process; (first_output_s, result). Its dirs are removed."""
    dirs = {
        k: tempfile.mkdtemp(prefix="kcb-aot-")
        for k in ("TMPDIR", "KCACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")
    }
    env = dict(os.environ)
    env.update(dirs)
    env.update({"KCACHE_URL": url, "TORCHINDUCTOR_COMPILE_THREADS": "1"})
    env.update(extra_env or {})
    env["KCACHE_T0"] = repr(time.time())
    p = subprocess.run(
        [
            sys.executable,
            WORKER,
            "--mode",
            mode,
            "--model",
            model,
            "--buckets",
            BUCKETS,
            "--name",
            "bench",
        ]
        + list(args),
        env=env,
        capture_output=True,
        text=True,
    )
    for d in dirs.values():
        shutil.rmtree(d, ignore_errors=True)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            return r.get("first_output_s"), r
    raise SystemExit("worker failed: %s" % p.stderr[-3000:])


def local_dir(url, model):
    """torch's local cache dir after one cold run of model."""
    d = tempfile.mkdtemp(prefix="kcb-aot-full-")
    spawn(url, model, "tcompile", {"TORCHINDUCTOR_CACHE_DIR": d})
    return d


def one(url, model, path, full):
    if path == "eager":
        return spawn(url, model, "eager")
    if path == "cold":
        return spawn(url, model, "tcompile")
    if path == "local":
        d = tempfile.mkdtemp(prefix="kcb-aot-ind-")
        shutil.rmtree(d)
        shutil.copytree(full[model], d)
        try:
            return spawn(
                url, model, "tcompile", {"TORCHINDUCTOR_CACHE_DIR": d}
            )
        finally:
            shutil.rmtree(d, ignore_errors=True)
    env = {"KCACHE_AOT_LOADER": "python"} if path == "aot-py" else {}
    t, r = spawn(url, model, "serve", env, ["--no-build", "--check", "1"])
    st = [b["state"] for b in r["stats"]["buckets"].values()]
    if st != ["loaded"] * len(st) or not r["equal"]:
        raise SystemExit("aot path did not load: %s" % r)
    return t, r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--models", default="pair,gpt2")
    ap.add_argument("--paths", default="eager,cold,local,aot,aot-py")
    a = ap.parse_args()
    models = a.models.split(",")
    paths = a.paths.split(",")
    s = kcserver.start_kcached()
    times = {m: {p: [] for p in paths} for m in models}
    full = {}
    try:
        for m in models:
            t0 = time.time()
            _, r = spawn(s.url, m, "publish")
            print(
                "published %s in %.1f s: %s"
                % (
                    m,
                    time.time() - t0,
                    [b["state"] for b in r["publish"]["buckets"]],
                ),
                file=sys.stderr,
            )
            if "local" in paths:
                full[m] = local_dir(s.url, m)
        for i in range(a.runs):
            for m in models:
                for p in paths:
                    t, _ = one(s.url, m, p, full)
                    times[m][p].append(t)
                    print(
                        "run %d %s %s: %.2f s" % (i, m, p, t), file=sys.stderr
                    )
    finally:
        s.cleanup()
        for d in full.values():
            shutil.rmtree(d, ignore_errors=True)
    print(
        "time from spawn to first output, CPU, median of %d fresh "
        "processes each (%s)\n" % (a.runs, time.strftime("%Y-%m-%d"))
    )
    print("| model | path | median s | min-max s | x eager | x cold |")
    print("|---|---|---|---|---|---|")
    for m in models:
        med = {p: statistics.median(v) for p, v in times[m].items()}
        for p in paths:
            v = times[m][p]
            print(
                "| %s | %s | %.2f | %.2f-%.2f | %s | %s |"
                % (
                    m,
                    p,
                    med[p],
                    min(v),
                    max(v),
                    "%.2f" % (med[p] / med["eager"])
                    if "eager" in med
                    else "-",
                    "%.2f" % (med[p] / med["cold"]) if "cold" in med else "-",
                )
            )
    print("\n" + json.dumps(times))


if __name__ == "__main__":
    main()
