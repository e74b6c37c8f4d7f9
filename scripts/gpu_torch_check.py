#!/usr/bin/env python3
"""gpu_torch_check.py: torch.compile of the torch tests' model (an MLP and
an attention block, dynamic batch) through an already-running kcached:
time to first output cold, then warm through Inductor's remote caches,
kcache.triton (on cuda) and Mega-Cache, each the median of --runs fresh
processes with empty local caches, with torch's and Triton's hit counters.

usage: python3 scripts/gpu_torch_check.py --url http://127.0.0.1:PORT \
         --resp redis://127.0.0.1:RPORT --device cuda|cpu --runs 3
Prints one line per result, `ROW\\t<check>\\t<PASS|FAIL|SKIP>\\t<detail>`; the
progress goes to stderr. Exit 0 when no row failed.

The package: the installed kcache, or PYTHONPATH=python with libkcache.so
found through KCACHE_LIB, beside the package, or in build/client/ (the GPU
machine has no network: its tree carries python/ and the library). Needs
torch (2.11 and later) and redis-py; triton for the triton row.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
if os.path.isdir(os.path.join(ROOT, "python", "kcache")):
    pp = os.environ.get("PYTHONPATH", "")
    if os.path.join(ROOT, "python") not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(
            [p for p in (os.path.join(ROOT, "python"), pp) if p]
        )

import torch_paths  # noqa: E402


def row(name, status, detail):
    print(
        "ROW\t%s\t%s\t%s" % (name, status, detail.replace("\t", " ")),
        flush=True,
    )


def fmt_counters(s):
    c = s["counters"]
    parts = [
        "fx %g/%g"
        % (c.get("fxgraph_cache_hit", 0), c.get("fxgraph_cache_miss", 0)),
        "aot %g/%g"
        % (c.get("autograd_cache_hit", 0), c.get("autograd_cache_miss", 0)),
    ]
    if "triton" in s:
        parts.append(
            "kcache.triton hits %g misses %g errors %g"
            % (
                s["triton"]["hits"],
                s["triton"]["misses"],
                s["triton"]["errors"],
            )
        )
    return "hit/miss " + ", ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--resp", required=True)
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--token", default=os.environ.get("KCACHE_TOKEN"))
    a = ap.parse_args()
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    try:
        import torch

        if a.device == "cuda" and not torch.cuda.is_available():
            row("torch_cold", "FAIL", "torch sees no CUDA device")
            return 1
    except ImportError as e:
        row("torch_cold", "SKIP", "no torch: %s" % e)
        return 0
    paths = ["cold", "remote", "mega"]
    if a.device == "cuda":
        paths.insert(2, "triton")
    failed = {}

    def report(rounds, res):
        """ROW lines after each round (gpu-check.sh keeps the last per name),
        so that a time limit keeps what was measured."""
        cold = res.get("cold") or {}
        for path, s in res.items():
            c = s["counters"]
            if path == "cold":
                good = True
            elif path == "triton":
                good = s.get("triton", {}).get("hits", 0) > 0
            else:
                good = (
                    c.get("fxgraph_cache_hit", 0) > 0
                    and c.get("fxgraph_cache_miss", 0) == 0
                )
            ok = s["n"] == rounds and s["equal"] and good
            failed[path] = not ok or rounds < a.runs
            speed = ""
            if path != "cold" and cold.get("median_s") and s["median_s"]:
                speed = ", %.2fx of cold (saves %.2fs)" % (
                    s["median_s"] / cold["median_s"],
                    cold["median_s"] - s["median_s"],
                )
            fill = "; fill %ss" % s["fill_s"] if s.get("fill_s") else ""
            row(
                "torch_cold" if path == "cold" else "torch_warm_" + path,
                "PASS" if ok else "FAIL",
                "%smedian %ss of %d runs %s%s%s; %s"
                % (
                    a.device + " " if path == "cold" else "",
                    s["median_s"],
                    s["n"],
                    s["runs_s"],
                    speed,
                    fill,
                    fmt_counters(s),
                ),
            )

    if "triton" not in paths:
        row(
            "torch_warm_triton",
            "SKIP",
            "kcache.triton is exercised by GPU "
            "compiles only (Inductor on the CPU writes C++)",
        )
    try:
        torch_paths.measure(
            a.url,
            a.resp,
            a.device,
            a.runs,
            paths,
            token=a.token,
            python=sys.executable,
            log=log,
            done=report,
        )
    except Exception as e:  # a row, not a traceback, for the table
        row("torch_check", "FAIL", "%s: %s" % (type(e).__name__, e))
        return 1
    failed = any(failed.values())
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
