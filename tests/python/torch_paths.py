"""torch_paths.py: time to first output of the test model (torch_worker.py)
cold and through each warm path, each sample a fresh process with empty
local caches, against a kcached that is already running. Shared by
tests/bench/bench_torch.py and scripts/gpu_torch_check.py.

Paths: eager (no compile: the floor), cold (no kcache; torch's local
caches empty), warm (the one call, kcache.torch.warm), remote (Inductor's
FX graph and AOTAutograd remote caches over RESP), mega (Mega-Cache),
cachedir (cache_dir_bundle: warm's per-entry bundles without its GPU
choices; on the CPU the same as warm), triton (kcache.triton as TRITON_CACHE_MANAGER;
GPU only), local (torch's own best case: the local TORCHINDUCTOR_CACHE_DIR
already full, no kcache), local0 (the same with Inductor's precompiled
header off, as warm() runs: torch's floor for a fresh machine). Every
process gets a fresh $TMPDIR (a fresh machine: Inductor's precompiled
header lives there).
"""

import shutil
import statistics
import tempfile
import time

import kcserver

# The compile phases (torch._dynamo.utils.compilation_time_metrics) a path
# can save, by the names torch 2.11-2.13 record.
PHASES = {
    "dynamo": "_compile.compile_inner",  # everything below too
    "aot": "create_aot_dispatcher_function",  # AOTAutograd, Inductor
    "inductor": "compile_fx.<locals>.fw_compiler_base",  # Inductor (or hit)
    "lowering": "GraphLowering.run",  # Inductor's lowering
    "cpp_compile": "compile_file",  # g++ (CPU kernels)
}


def fresh_env(url, resp_url, token=None, device="cpu", extra=None):
    e = {
        "KCACHE_URL": url,
        "KCACHE_RESP_URL": resp_url or "",
        "KCACHE_TOKEN": token or "",
        "TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="kcb-ind-"),
        "TRITON_CACHE_DIR": tempfile.mkdtemp(prefix="kcb-tri-"),
        "KCACHE_DIR": tempfile.mkdtemp(prefix="kcb-kc-"),
        "TMPDIR": tempfile.mkdtemp(prefix="kcb-tmp-"),
    }
    if device == "cpu":
        e.pop("TRITON_CACHE_DIR")
    e.update(extra or {})
    return e


def _drop(env):
    for k in (
        "TORCHINDUCTOR_CACHE_DIR",
        "TRITON_CACHE_DIR",
        "KCACHE_DIR",
        "TMPDIR",
    ):
        if k in env:
            shutil.rmtree(env[k], ignore_errors=True)


def run(
    path,
    url,
    resp_url,
    device,
    token=None,
    args=(),
    python=None,
    env_extra=None,
    keep=False,
):
    """One fresh process; returns (result, env)."""
    env = fresh_env(url, resp_url, token, device, env_extra)
    worker_path = "none" if path in ("cold", "local", "local0") else path
    r = kcserver.run_worker(
        worker_path,
        env,
        ["--device", device] + list(args),
        python=python,
        check=False,
    )
    if not keep:
        _drop(env)
    return r, env


def summarize(rs):
    ok = [r for r in rs if r]
    times = [r["first_output_s"] for r in ok]
    out = {
        "n": len(ok),
        "failed": len(rs) - len(ok),
        "median_s": round(statistics.median(times), 3) if times else None,
        "runs_s": [round(t, 2) for t in times],
        "equal": all(r["equal"] for r in ok) and bool(ok),
    }
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
        out["triton"] = {
            k: sum(t.get(k, 0) for t in tstats) / len(tstats)
            for k in ("hits", "misses", "uploads", "errors")
        }
    return out


def _summaries(paths, results, fills):
    out = {}
    for path in paths:
        out[path] = summarize(results[path])
        if path in fills:
            out[path]["fill_s"] = fills[path]
    return out


def measure(
    url,
    resp_url,
    device="cpu",
    runs=5,
    paths=None,
    token=None,
    python=None,
    log=print,
    done=None,
    model="pair",
):
    """Fills kcached once per warm path (process A), keeps a cold run's
    local cache dir for "local", then runs `runs` rounds, each one fresh
    process per path in turn: interleaved, so that a shared machine's load
    swings fall on every path alike. Returns {path: summary}. done(rounds,
    {path: summary}), if given, is called after each round, so that a
    caller under a time limit keeps what was measured."""
    paths = paths or [
        "eager",
        "cold",
        "local",
        "local0",
        "warm",
        "cachedir",
        "mega",
        "remote",
    ]
    extra = {p: {} for p in paths}
    margs = ["--model", model]
    if "triton" in extra:
        extra["triton"]["TRITON_CACHE_MANAGER"] = "kcache.triton:CacheManager"
    fills = {}
    for path in [
        p for p in paths if p not in ("cold", "local", "local0", "eager")
    ]:
        a, _ = run(
            path,
            url,
            resp_url,
            device,
            token,
            python=python,
            env_extra=extra[path],
            args=margs,
        )
        fills[path] = a and a["first_output_s"]
        log("%s fill: %s" % (path, fills[path]))
    fulls = {}
    extra["local0"] = {"TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS": "0"}
    for loc in ("local", "local0"):  # torch's best case: what cold left
        if loc in paths:
            a, fulls[loc] = run(
                "cold",
                url,
                resp_url,
                device,
                token,
                python=python,
                keep=True,
                args=margs,
                env_extra=extra[loc],
            )
            log("%s fill: %s" % (loc, a and a["first_output_s"]))
    results = {p: [] for p in paths}
    for i in range(runs):
        for path in paths:
            env_extra = dict(extra[path])
            copies = []
            if path in fulls:
                full = fulls[path]
                for var in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
                    if var in full:
                        d = tempfile.mkdtemp(prefix="kcb-full-")
                        shutil.rmtree(d)
                        shutil.copytree(full[var], d, symlinks=True)
                        env_extra[var] = d
                        copies.append(d)
            args = margs + (
                []
                if path in ("cold", "local", "local0", "eager")
                else ["--no-upload"]
            )
            r, _ = run(
                path,
                url,
                resp_url,
                device,
                token,
                python=python,
                env_extra=env_extra,
                args=args,
            )
            for d in copies:
                shutil.rmtree(d, ignore_errors=True)
            results[path].append(r)
            log("%s run %d: %s" % (path, i + 1, r and r["first_output_s"]))
        if done:
            done(i + 1, _summaries(paths, results, fills))
    for full in fulls.values():
        _drop(full)
    out = _summaries(paths, results, fills)
    return out


def table(res, cold_key="cold", local_key="local"):
    """A Markdown table: median, x of cold and of torch's full local dir,
    the compile phases left."""
    cold = (res.get(cold_key) or {}).get("median_s")
    local = (res.get(local_key) or {}).get("median_s")
    lines = [
        "| path | median s (first output) | runs s | vs cold | vs local |"
        " dynamo s | AOT s | Inductor s | C++ compile s | FX hit/miss |"
        " AOT hit/miss |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for path, s in res.items():
        m = s["median_s"]
        c = s["counters"]
        ph = s["phases"]
        lines.append(
            "| %s | %s | %s | %s | %s | %.2f | %.2f | %.2f | %.2f | "
            "%g/%g | %g/%g |"
            % (
                path,
                m,
                " ".join("%.1f" % t for t in s["runs_s"]),
                ("%.2fx" % (m / cold)) if m and cold else "-",
                ("%.2fx" % (m / local)) if m and local else "-",
                ph["dynamo"],
                ph["aot"],
                ph["inductor"],
                ph["cpp_compile"],
                c.get("fxgraph_cache_hit", 0),
                c.get("fxgraph_cache_miss", 0),
                c.get("autograd_cache_hit", 0),
                c.get("autograd_cache_miss", 0),
            )
        )
    return "\n".join(lines)


def now():
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
