#!/usr/bin/env python3
"""test_readme.py: every line README.md gives a user to paste (its code
blocks) is run by a test. The lines of "Using it" (kcached, warm, the CI
line), the `kcache suggest` line and the page's terminal lines run here,
as written, in a scratch directory whose build/ is this build, with these
substitutions only: the data directory (/var/lib/kcache), the port 8080
(kcached's through KCACHED_LISTEN, its own variable), and the user's
`warmup.json` (the demo's manifest). The other lines name the test that
runs them; a new line that is in neither list fails this test.

Usage: test_readme.py --root REPO --build BUILD_DIR
Exit 77 (skip) without NVRTC (the lines build kernels), 1 under CI=true.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from kcharness import free_port  # noqa: E402

A = None

# README lines run elsewhere, and where.
ELSEWHERE = {
    "pip install ./python redis": "python_firsthour",
    "export KCACHE_URL=http://kcached:8080 KCACHE_TOKEN=...": "python_firsthour",
    "import kcache.torch as kt": "python_firsthour",
    'with kt.warm(model, name="my-service") as w:': "python_firsthour",
    "compiled = torch.compile(model)": "python_firsthour",
    "for x in warmup_inputs: compiled(x)": "python_firsthour",
    "print(w.stats)": "python_firsthour",
    "./scripts/run.sh": "python_firsthour (KCACHE_RUN_REUSE_BUILD=1: this build)",
    "./scripts/test.sh": "the test run itself",
    "scripts/gpu-check.sh pack": "gpu_check_script",
    "scripts/gpu-check.sh run": "gpu_check_script",
    # needs an S3 bucket: test_scaleout runs kcached with these flags on Ceph RGW
    "kcached --data-dir /var/lib/kcache --max-bytes 200G \\": "scaleout",
    "--s3-endpoint https://s3.eu-west-1.amazonaws.com --s3-bucket kernels --s3-region eu-west-1": "scaleout",
}
HERE_BLOCKS = ("using", "suggest", "page")


def code_lines(text):
    """README's code lines (comments dropped): indented 4 or more spaces,
    after a blank line or another code line."""
    lines, out, prev = text.split("\n"), [], False
    for i, ln in enumerate(lines):
        code = bool(re.match(r"^ {4,}\S", ln)) and (
            not lines[i - 1].strip() or prev
        )
        if code:
            out.append(re.sub(r"\s+#\s.*$", "", ln.strip()))
        if ln.strip():
            prev = code
    return out


def block(text, after, n):
    """The n code lines that follow the line containing `after`."""
    lines = code_lines(text[text.index(after) :])
    return lines[:n]


class Readme(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        with open(os.path.join(A.root, "README.md"), encoding="utf-8") as f:
            cls.text = f.read()
        cls.using = block(cls.text, "## Using it", 4)
        cls.suggest = block(cls.text, "Demand feedback", 1)
        cls.page = block(cls.text, "The same from a terminal", 4)

    def test_every_line_is_run(self):
        here = set(self.using + self.suggest + self.page)
        missing = [
            ln
            for ln in code_lines(self.text)
            if ln not in here and ln not in ELSEWHERE
        ]
        self.assertEqual(missing, [], "README lines no test runs")

    def test_lines_run_as_written(self):
        d = tempfile.mkdtemp(prefix="kc-readme-")
        self.addCleanup(shutil.rmtree, d, True)
        os.symlink(os.path.abspath(A.build), os.path.join(d, "build"))
        os.symlink(os.path.join(A.root, "deploy"), os.path.join(d, "deploy"))
        demo = os.path.join(A.root, "deploy", "examples", "demo-mlp")
        shutil.copy(
            os.path.join(demo, "warmup.json"), os.path.join(d, "warmup.json")
        )
        shutil.copytree(
            os.path.join(demo, "kernels"), os.path.join(d, "kernels")
        )
        port = free_port()
        data = os.path.join(d, "data")
        env = dict(
            os.environ,
            KCACHED_LISTEN="127.0.0.1:%d" % port,
            KCACHE_DIR=os.path.join(d, "kc"),
            PATH=os.path.join(d, "build", "client")
            + os.pathsep
            + os.environ["PATH"],
        )
        env.pop("KCACHE_URL", None)
        env.pop("KCACHE_TOKEN", None)

        def sub(line):
            return line.replace("/var/lib/kcache", data).replace(
                ":8080", ":%d" % port
            )

        serve, rest = self.using[0], self.using[1:]
        self.assertTrue(serve.startswith("build/server/kcached "), serve)
        log = open(os.path.join(d, "kcached.log"), "w")
        self.addCleanup(log.close)
        srv = subprocess.Popen(
            ["bash", "-c", "exec " + sub(serve)],
            cwd=d,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.addCleanup(srv.wait)
        self.addCleanup(srv.terminate)
        for _ in range(100):
            try:
                urllib.request.urlopen(
                    "http://127.0.0.1:%d/healthz" % port, timeout=2
                ).close()
                break
            except OSError:
                self.assertIsNone(srv.poll(), "kcached exited")
                time.sleep(0.1)
        script = "set -e\n" + "\n".join(
            sub(ln) for ln in rest + self.suggest + self.page
        )
        with open(os.path.join(d, "warmup.json")) as f:
            hash_ = json.load(f)["model"]["hash"]
        script = script.replace("--confirm HASH", "--confirm " + hash_)
        r = subprocess.run(
            ["bash", "-x", "-c", script],
            cwd=d,
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        # what they did: the --out files, the CI line's third arch, the purge
        self.assertTrue(os.path.isdir(os.path.join(d, "kernels", "sm_90a")))
        self.assertIn("sm_100f", r.stdout + r.stderr)
        self.assertIn("demo-mlp", r.stdout)
        if os.environ.get("KCACHE_TEST_VERBOSE"):
            print(r.stdout[-3000:], r.stderr[-3000:])


def main():
    global A
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--build", required=True)
    A, rest = ap.parse_known_args()
    A.root = os.path.abspath(A.root)
    have_nvrtc = os.environ.get("KCACHE_NVRTC") or any(
        os.path.exists(os.path.join(h, "lib64"))
        for h in (
            os.environ.get("CUDA_HOME", "/nonexistent"),
            "/usr/local/cuda",
        )
    )
    if not have_nvrtc:
        print(
            "test_readme: no NVRTC (KCACHE_NVRTC, scripts/nvrtc.sh): skipped"
        )
        sys.exit(1 if os.environ.get("CI") == "true" else 77)
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)


if __name__ == "__main__":
    main()
