"""torch_paths.py: time to first output of the test model (torch_worker.py)
cold and through each warm path, each sample a fresh process with empty
local caches, against a kcached that is already running. Shared by
tests/bench/bench_torch.py and scripts/gpu_torch_check.py.

Paths: cold (no kcache; torch's local caches empty), remote (Inductor's
FX graph and AOTAutograd remote caches over RESP), mega (Mega-Cache),
cachedir (cache-dir bundles), triton (kcache.triton as
TRITON_CACHE_MANAGER; GPU only), local (torch's own best case: the local
TORCHINDUCTOR_CACHE_DIR already full, no kcache).
"""
import shutil
import statistics
import tempfile
import time

import kcserver

# The compile phases (torch._dynamo.utils.compilation_time_metrics) a path
# can save, by the names torch 2.11-2.13 record.
PHASES = {
    "dynamo": "_compile.compile_inner",              # everything below too
    "aot": "create_aot_dispatcher_function",         # AOTAutograd, Inductor
    "inductor": "compile_fx.<locals>.fw_compiler_base",  # Inductor (or hit)
    "lowering": "GraphLowering.run",                 # Inductor's lowering
    "cpp_compile": "compile_file",                   # g++ (CPU kernels)
}


def fresh_env(url, resp_url, token=None, device="cpu", extra=None):
    e = {"KCACHE_URL": url, "KCACHE_RESP_URL": resp_url or "",
         "KCACHE_TOKEN": token or "",
         "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="kcb-ind-"),
         "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="kcb-tri-"),
         "KCACHE_DIR": tempfile.mkdtemp(prefix="kcb-kc-")}
    if device == "cpu":
        e.pop("TRITON_CACHE_DIR")
    e.update(extra or {})
    return e


def _drop(env):
    for k in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "KCACHE_DIR"):
        if k in env:
            shutil.rmtree(env[k], ignore_errors=True)


def run(path, url, resp_url, device, token=None, args=(), python=None,
        env_extra=None, keep=False):
    """One fresh process; returns (result, env)."""
    env = fresh_env(url, resp_url, token, device, env_extra)
    worker_path = "none" if path in ("cold", "local") else path
    r = kcserver.run_worker(worker_path, env, ["--device", device] +
                            list(args), python=python, check=False)
    if not keep:
        _drop(env)
    return r, env


def summarize(rs):
    ok = [r for r in rs if r]
    times = [r["first_output_s"] for r in ok]
    out = {"n": len(ok), "failed": len(rs) - len(ok),
           "median_s": round(statistics.median(times), 3) if times else None,
           "runs_s": [round(t, 2) for t in times],
           "equal": all(r["equal"] for r in ok) and bool(ok)}
    counters = {}
    for r in ok:
        for k, v in r["counters"].items():
            counters[k] = counters.get(k, 0) + v
    out["counters"] = {k: v / max(1, len(ok)) for k, v in counters.items()}
    phases = {}
    for name, metric in PHASES.items():
        vals = [r.get("phases", {}).get(metric) for r in ok]
        vals = [v for v in vals if v is not None]
        phases[name] = round(statistics.median(vals), 3) if vals else 0.0
    out["phases"] = phases
    tstats = [r.get("triton") for r in ok if isinstance(r.get("triton"), dict)]
    if tstats:
        out["triton"] = {k: sum(t.get(k, 0) for t in tstats) / len(tstats)
                         for k in ("hits", "misses", "uploads", "errors")}
    return out


def measure(url, resp_url, device="cpu", runs=5, paths=None, token=None,
            python=None, log=print, done=None):
    """Fills kcached once per path (process A), then `runs` fresh processes
    per path; returns {path: summary}. cold and local need no kcached.
    done(path, summary, out), if given, is called as each path ends (so a
    caller under a time limit keeps what was measured)."""
    paths = paths or ["cold", "remote", "mega", "cachedir", "local"]
    out = {}
    if "cold" in paths:
        rs = []
        for i in range(runs):
            r, _ = run("cold", url, resp_url, device, token, python=python)
            rs.append(r)
            log("cold run %d: %s" % (i + 1, r and r["first_output_s"]))
        out["cold"] = summarize(rs)
        if done:
            done("cold", out["cold"], out)
    for path in [p for p in paths if p not in ("cold", "local")]:
        extra = {}
        if path == "triton":
            extra["TRITON_CACHE_MANAGER"] = "kcache.triton:CacheManager"
        a, _ = run(path, url, resp_url, device, token, python=python,
                   env_extra=extra)
        log("%s fill: %s" % (path, a and a["first_output_s"]))
        rs = []
        for i in range(runs):
            r, _ = run(path, url, resp_url, device, token, python=python,
                       env_extra=extra, args=["--no-upload"])
            rs.append(r)
            log("%s run %d: %s" % (path, i + 1, r and r["first_output_s"]))
        out[path] = summarize(rs)
        out[path]["fill_s"] = a and a["first_output_s"]
        if done:
            done(path, out[path], out)
    if "local" in paths:
        # torch's best case: the local cache dir that a cold run left
        a, env = run("cold", url, resp_url, device, token, python=python,
                     keep=True)
        full = env["TORCHINDUCTOR_CACHE_DIR"]
        rs = []
        for i in range(runs):
            d = tempfile.mkdtemp(prefix="kcb-full-")
            shutil.rmtree(d)
            shutil.copytree(full, d, symlinks=True)
            extra = {"TORCHINDUCTOR_CACHE_DIR": d}
            if "TRITON_CACHE_DIR" in env:
                t = tempfile.mkdtemp(prefix="kcb-tfull-")
                shutil.rmtree(t)
                shutil.copytree(env["TRITON_CACHE_DIR"], t, symlinks=True)
                extra["TRITON_CACHE_DIR"] = t
            r, _ = run("local", url, resp_url, device, token, python=python,
                       env_extra=extra)
            rs.append(r)
            log("local run %d: %s" % (i + 1, r and r["first_output_s"]))
        _drop(env)
        out["local"] = summarize(rs)
        if done:
            done("local", out["local"], out)
    return out


def table(res, cold_key="cold"):
    """A Markdown table: median, x of cold, the compile phases left."""
    cold = (res.get(cold_key) or {}).get("median_s")
    lines = ["| path | median s (first output) | vs cold | dynamo s | "
             "AOT s | Inductor s | lowering s | C++ compile s | FX hit/miss | "
             "AOT hit/miss |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for path, s in res.items():
        m = s["median_s"]
        c = s["counters"]
        ph = s["phases"]
        lines.append("| %s | %s | %s | %.2f | %.2f | %.2f | %.2f | %.2f | "
                     "%g/%g | %g/%g |" % (
                         path, m, ("%.2fx" % (m / cold)) if m and cold else "-",
                         ph["dynamo"], ph["aot"], ph["inductor"],
                         ph["lowering"], ph["cpp_compile"], c.get("fxgraph_cache_hit", 0),
                         c.get("fxgraph_cache_miss", 0),
                         c.get("autograd_cache_hit", 0),
                         c.get("autograd_cache_miss", 0)))
    return "\n".join(lines)


def now():
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
