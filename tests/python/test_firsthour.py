"""test_firsthour: a torch user's first hour, as written. scripts/run.sh
starts kcached (KCACHE_RUN_REUSE_BUILD=1: this build's binaries, the same
code path for everything it prints), and prints, between "#>>> kcache" and
"#<<< kcache", the lines a user pastes. Those lines, parsed from its output
and run exactly as printed by bash:

- the install line, in a new virtual environment that sees the torch
  environment's packages (a user's service environment): the package
  builds its own libkcache.so;
- a small torch.compile in a fresh process with an empty local Inductor
  cache, twice: the second process hits Inductor's FX graph cache from
  kcached (the first misses and uploads);
- Triton's cache manager (the installed triton): a kernel's group put on
  one cache directory comes back on another, empty one;
- README's first screen, as written: its install line (from the
  repository's root), its torch snippet in two fresh processes (kcached's
  address for "kcached:8080"; run.sh's kcached takes no token), the second
  hitting what the first uploaded, and its kt.compile line.

No line run.sh prints escapes: one this test does not know fails it."""

import json
import os
import re
import shlex
import signal
import site
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import need
import kcserver

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
WORKER = os.path.join(HERE, "firsthour_worker.py")
BEGIN, END = "#>>> kcache", "#<<< kcache"


def build_dir():
    """The build whose kcached the tests were given (KCACHED), else build/."""
    kcached = os.environ.get("KCACHED")
    if kcached:
        return os.path.dirname(os.path.dirname(os.path.abspath(kcached)))
    return os.path.join(ROOT, "build")


def printed_block(lines):
    """The lines between the markers, without blank ones."""
    block = lines[lines.index(BEGIN) + 1 : lines.index(END)]
    return [ln for ln in block if ln.strip()]


class RunSh:
    """scripts/run.sh serving in the background, and what it printed."""

    def __init__(self, tmp):
        self.tmp = tmp
        env = dict(
            os.environ,
            KCACHE_RUN_REUSE_BUILD="1",
            KCACHE_BUILD_DIR=build_dir(),
            KCACHE_PORT=str(kcserver.free_port()),
            KCACHE_RESP_PORT=str(kcserver.free_port()),
            KCACHED_DATA_DIR=os.path.join(tmp, "data"),
            KCACHED_LOG=os.path.join(tmp, "kcached.log"),
            KCACHE_OUT=os.path.join(tmp, "out"),
            KCACHE_DIR=os.path.join(tmp, "kc-runsh"),
        )
        self.proc = subprocess.Popen(
            [os.path.join(ROOT, "scripts", "run.sh")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines = []
        deadline = time.time() + 120
        for line in self.proc.stdout:
            self.lines.append(line.rstrip("\n"))
            if (
                line.startswith("run.sh: kcached serves")
                or time.time() > deadline
            ):
                break
        assert any(
            ln.startswith("run.sh: kcached serves") for ln in self.lines
        ), "run.sh did not get to serving:\n" + "\n".join(self.lines[-30:])

    def stop(self):
        # Ctrl-C: its trap stops kcached
        os.killpg(self.proc.pid, signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


@pytest.fixture(scope="module")
def runsh():
    need("torch")
    need("triton")
    need("redis")
    tmp = tempfile.mkdtemp(prefix="kcache-firsthour-")
    r = RunSh(tmp)
    try:
        yield r
    finally:
        r.stop()
        subprocess.run(["rm", "-rf", tmp], check=False)


@pytest.fixture(scope="module")
def block(runsh):
    lines = printed_block(runsh.lines)
    installs = [ln for ln in lines if ln.startswith("pip install ")]
    exports = [ln for ln in lines if re.match(r"export [A-Z_]+=\S+$", ln)]
    assert len(installs) == 1, lines
    assert installs + exports == lines, (
        "a line this test does not run: %r" % lines
    )
    return installs[0], exports


@pytest.fixture(scope="module")
def venv(runsh, block):
    """A new environment over this one's packages (torch, triton, redis-py,
    numpy: the service's own), where the printed install line runs."""
    d = os.path.join(runsh.tmp, "venv")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", d], check=True)
    purelib = subprocess.run(
        [
            os.path.join(d, "bin", "python"),
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    with open(os.path.join(purelib, "torchenv.pth"), "w") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    t = time.time()
    r = subprocess.run(
        ["bash", "-c", "set -e; " + block[0]],
        env=user_env(d),
        cwd=runsh.tmp,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    print("install line: %.1f s" % (time.time() - t))
    # the package it installed, with its own library: not this environment's
    r = subprocess.run(
        [
            "python",
            "-c",
            "import kcache; print(kcache.__file__, kcache.LIB_PATH)",
        ],
        env=user_env(d),
        cwd=runsh.tmp,
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    assert all(p.startswith(purelib) for p in r.stdout.split()), (
        r.stdout,
        purelib,
    )
    return d


def user_env(venv_dir, **extra):
    """A user's shell with the venv activated: no test-only variables."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k
        not in (
            "PYTHONPATH",
            "KCACHE_LIB",
            "KCACHE_URL",
            "KCACHE_TOKEN",
            "VIRTUAL_ENV",
        )
        and not k.startswith(("TORCHINDUCTOR_", "TRITON_"))
    }
    env["PATH"] = (
        os.path.join(venv_dir, "bin") + os.pathsep + env.get("PATH", "")
    )
    env["VIRTUAL_ENV"] = venv_dir
    env.update(extra)
    return env


def run_pasted(venv_dir, exports, argv, **extra):
    """argv in a fresh process after the printed lines, through bash."""
    script = (
        "set -e\n"
        + "\n".join(exports)
        + "\nexec "
        + " ".join(map(shlex.quote, argv))
    )
    r = subprocess.run(
        ["bash", "-c", script],
        env=user_env(venv_dir, **extra),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1]), r.stderr


def test_printed_lines(runsh, block):
    """What a torch user pastes: the package, Inductor's remote caches on
    kcached's Redis port, Triton's cache manager on kcached; none of the
    lines that fail on this machine."""
    install, exports = block
    assert install.split()[2] == os.path.join(ROOT, "python")
    names = {
        ln.split()[1].split("=")[0]: ln.split("=", 1)[1] for ln in exports
    }
    assert "TORCHINDUCTOR_BUNDLED_AUTOTUNE_REMOTE_CACHE" not in names
    assert "TRITON_REMOTE_CACHE_BACKEND" not in names
    assert names["TRITON_CACHE_MANAGER"] == "kcache.triton:CacheManager"
    assert names["TORCHINDUCTOR_REDIS_URL"].startswith("redis://127.0.0.1:")
    assert names["KCACHE_URL"].startswith("http://127.0.0.1:")


def test_torch_second_process_hits(venv, block, tmp_path):
    runs = []
    for i in range(2):
        out, err = run_pasted(
            venv,
            block[1],
            ["python", WORKER, "torch"],
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / ("inductor%d" % i)),
        )
        assert out["shape"] == [4, 8]
        runs.append(out["inductor"])
    assert runs[0].get("fxgraph_cache_miss", 0) >= 1, runs
    assert runs[0].get("fxgraph_cache_hit", 0) == 0, runs
    assert runs[1].get("fxgraph_cache_hit", 0) >= 1, runs
    assert runs[1].get("fxgraph_cache_miss", 0) == 0, runs


def test_triton_group_across_cache_dirs(venv, block, tmp_path):
    key = "%064x" % int(time.time() * 1e6)
    put, _ = run_pasted(
        venv,
        block[1],
        ["python", WORKER, "triton-put", key],
        TRITON_CACHE_DIR=str(tmp_path / "triton-a"),
        KCACHE_DIR=str(tmp_path / "kc-a"),
    )
    assert put["manager"] == "kcache.triton.CacheManager"
    assert put["before"] is False and put["stats"]["uploads"] == 1, put
    got, _ = run_pasted(
        venv,
        block[1],
        ["python", WORKER, "triton-get", key],
        TRITON_CACHE_DIR=str(tmp_path / "triton-b"),
        KCACHE_DIR=str(tmp_path / "kc-b"),
    )
    assert got["stats"]["hits"] == 1, got
    assert got["files"] == {"k.cubin": True, "k.ptx": True, "k.json": True}, (
        got
    )


# ---- README's first screen ----


def readme_first_screen():
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    first = text[
        text.index("## torch.compile: start warm") : text.index("## Set up")
    ]
    install = re.findall(r"^ +(pip install .*)$", first, re.M)
    step2 = first[
        first.index("2. ") : first.index("   For an exportable model")
    ]
    code = [ln[7:] for ln in step2.splitlines() if ln.startswith("       ")]
    compile_line = re.search(
        r"`(compiled = kt\.compile\([^`]*\))`", first
    ).group(1)
    return install, code, compile_line


SNIPPET_PRELUDE = """import json, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
warmup_inputs = [torch.randn(4, 32)]
x1, x8 = torch.randn(1, 32), torch.randn(8, 32)
"""


def test_readme_install_line(venv):
    install, _, _ = readme_first_screen()
    assert install == ["pip install ./python redis"], install
    r = subprocess.run(
        ["bash", "-c", "set -e; " + install[0]],
        env=user_env(venv),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]


def readme_python(venv, tmp_path, block, code, epilogue, tag):
    """The snippet's export line (kcached's address, no token) and its
    Python lines, in a fresh process with empty local caches."""
    export = [ln for ln in code if ln.startswith("export ")]
    assert (
        len(export) == 1 and "KCACHE_URL=http://kcached:8080" in export[0]
    ), code
    url = [
        ln.split("=", 1)[1]
        for ln in block[1]
        if ln.startswith("export KCACHE_URL=")
    ][0]
    shell = (
        export[0]
        .replace("http://kcached:8080", url)
        .replace("KCACHE_TOKEN=...", "KCACHE_TOKEN=")
    )
    py = tmp_path / ("snippet-%s.py" % tag)
    py.write_text(
        SNIPPET_PRELUDE
        + "\n".join(ln for ln in code if not ln.startswith("export "))
        + "\n"
        + epilogue
    )
    r = subprocess.run(
        ["bash", "-c", "set -e\n%s\nexec python %s" % (shell, py)],
        env=user_env(
            venv,
            TORCHINDUCTOR_CACHE_DIR=str(tmp_path / ("ind-" + tag)),
            KCACHE_DIR=str(tmp_path / ("kc-" + tag)),
        ),
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def has(venv, name):
    r = subprocess.run(
        [
            os.path.join(venv, "bin", "python"),
            "-c",
            "import kcache.torch as kt; print(hasattr(kt, %r))" % name,
        ],
        env=user_env(venv),
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    return r.stdout.strip() == "True"


def test_readme_snippet_second_start_hits(venv, block, tmp_path):
    if not has(venv, "warm"):
        pytest.skip("kcache.torch.warm is not in this tree yet")
    _, code, _ = readme_first_screen()
    epi = "print(json.dumps({'stats': w.stats, 'counters': kt.counters()}, default=str))\n"
    first = readme_python(venv, tmp_path, block, code, epi, "a")
    second = readme_python(venv, tmp_path, block, code, epi, "b")
    assert first["counters"].get("fxgraph_cache_miss", 0) >= 1, first
    assert second["counters"].get("fxgraph_cache_hit", 0) >= 1, (first, second)
    assert second["counters"].get("fxgraph_cache_miss", 0) == 0, (
        first,
        second,
    )


def test_readme_compile_line(venv, block, tmp_path):
    if not has(venv, "compile"):
        pytest.skip("kcache.torch.compile is not in this tree yet")
    _, code, line = readme_first_screen()
    code = [ln for ln in code if ln.startswith(("export ", "import "))] + [
        line
    ]
    epi = (
        "import kcache.torch as kt\n"
        "print(json.dumps({'ok': all(bool(torch.allclose(compiled(x), model(x), atol=1e-4))"
        " for x in (x1, x8))}))\n"
    )
    out = readme_python(venv, tmp_path, block, code, epi, "c")
    assert out["ok"], out
