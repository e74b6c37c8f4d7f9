#!/usr/bin/env python3
"""bench_torch.py: torch.compile wall time, from process start to the first
output, cold and through each warm path, each run a fresh process with
empty local caches and a fresh $TMPDIR (a fresh machine), interleaved,
against a real kcached started here (build/server/kcached, --resp-listen).
Models (tests/python/torch_worker.py --model): pair (this project's: an
MLP and an attention block, dynamic batch) and gpt2 (transformers' GPT-2
architecture from a small config: 2 layers, width 64, random weights, no
download). Paths: eager (no compile: the floor), cold, local (torch's own
full TORCHINDUCTOR_CACHE_DIR, a copy of a cold run's; local0: the same
with Inductor's precompiled header off, as warm() runs), warm (the one call,
kcache.torch.warm), cachedir, mega, remote (tests/python/torch_paths.py),
and aot: the compiled artifacts per shape bucket (kcache.torch.compile),
which runs tests/bench/bench_aot.py's table (eager, cold, local, aot,
aot-py) for the same models and runs after this one's.
Prints a Markdown table per model: medians, x of cold and of local, the
compile phases left, then the JSON.

usage: build/venv/bin/python tests/bench/bench_torch.py [--runs 5]
       [--device cpu|cuda] [--models pair,gpt2]
       [--paths eager,cold,local,local0,warm,cachedir,mega,remote,aot]
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
    ap.add_argument(
        "--paths",
        default="eager,cold,local,local0,warm,cachedir,mega,remote,aot",
    )
    ap.add_argument("--models", default="pair,gpt2")
    a = ap.parse_args()
    paths = a.paths.split(",")
    aot = "aot" in paths
    paths = [p for p in paths if p != "aot"]
    out = {}
    for model in a.models.split(","):
        s = kcserver.start_kcached()  # each model its own, empty kcached
        try:
            out[model] = torch_paths.measure(
                s.url,
                s.resp_url,
                a.device,
                a.runs,
                paths,
                log=lambda m: print(m, file=sys.stderr),
                model=model,
            )
        finally:
            s.cleanup()
    for model, res in out.items():
        print(
            "\n%s: torch.compile, time to first output, %s, median of %d "
            "fresh processes each (%s)\n"
            % (model, a.device, a.runs, torch_paths.now())
        )
        print(torch_paths.table(res))
    print("\n" + json.dumps(out, indent=1))
    if aot:  # the artifacts' own table (publish first, then serve)
        sys.stdout.flush()
        import subprocess

        subprocess.run(
            [
                sys.executable,
                os.path.join(HERE, "bench_aot.py"),
                "--runs",
                str(a.runs),
                "--models",
                a.models,
            ],
            check=True,
        )


if __name__ == "__main__":
    main()
