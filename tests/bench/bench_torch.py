#!/usr/bin/env python3
"""bench_torch.py: torch.compile wall time, from process start to the first
output, of the test model (tests/python/torch_worker.py: an MLP and an
attention block, dynamic batch), cold and through each warm path, each run
a fresh process with empty local caches, against a real kcached started
here (build/server/kcached, --resp-listen). Prints a Markdown table of the
medians, what each path saves against cold, and the compile phases left
(torch._dynamo.utils.compilation_time_metrics), then the JSON.

usage: build/venv/bin/python tests/bench/bench_torch.py [--runs 5]
       [--device cpu|cuda] [--paths cold,remote,mega,cachedir,local]
(scripts/pyenv.sh makes build/venv; PYTHONPATH=python and the build's
libkcache.so are used, as the tests do.) On a shared machine the times
swing with the neighbours' load: compare medians of one run of the script.
"""
import argparse
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
os.environ.setdefault("PYTHONPATH", os.path.join(ROOT, "python"))
import kcserver  # noqa: E402
import torch_paths  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--paths", default="cold,remote,mega,cachedir,local")
    a = ap.parse_args()
    s = kcserver.start_kcached()
    try:
        res = torch_paths.measure(s.url, s.resp_url, a.device, a.runs,
                                  a.paths.split(","),
                                  log=lambda m: print(m, file=sys.stderr))
    finally:
        s.cleanup()
    print("torch.compile, time to first output, %s, median of %d fresh "
          "processes each (%s)\n" % (a.device, a.runs, torch_paths.now()))
    print(torch_paths.table(res))
    cold = res.get("cold", {}).get("median_s")
    if cold:
        print()
        for p, r in res.items():
            if p != "cold" and r["median_s"]:
                print("- %s saves %.1f s of %.1f s (%.0f%%)" % (
                    p, cold - r["median_s"], cold,
                    100 * (cold - r["median_s"]) / cold))
    print("\n" + json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
