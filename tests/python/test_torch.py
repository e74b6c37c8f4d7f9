"""test_torch: real PyTorch (torch==2.13.0, CPU: Inductor generates C++ and
compiles it with g++) compiling an MLP and an attention block with a dynamic
batch dimension through kcache. The one call, kcache.torch.warm: a service
started three times in fresh processes (fresh TORCHINDUCTOR_CACHE_DIR,
KCACHE_DIR and $TMPDIR each), its second and third starts served from
kcached's per-entry bundles: no upload, no miss, no g++ (a compiler wrapper
logs every compile), outputs equal to eager; a second model adds its
entries; a second write token cannot change what a reader of CI's entries
loads. Then the building blocks (remote caches, Mega-Cache) and the failure
cases: wrong token, another torch version, kcached down or silent, a
read-only token, concurrent processes (one upload per key). Each worker is
a fresh process (tests/python/torch_worker.py)."""

import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import urllib.request

import pytest

from conftest import need
import kcharness
import kcserver

HITS = {"fxgraph_cache_hit": 2, "autograd_cache_hit": 2}


_DIRS = []


@pytest.fixture(scope="module", autouse=True)
def torch_present():
    need("torch")
    need("redis")
    yield
    for d in _DIRS:
        shutil.rmtree(d, ignore_errors=True)


def _tmp(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    _DIRS.append(d)
    return d


def env_for(server, token=None, resp_url=None, **extra):
    """A fresh process's environment: empty local caches, a fresh $TMPDIR
    (where Inductor would put its precompiled header)."""
    e = {
        "KCACHE_URL": server.url if server else extra.pop("url"),
        "KCACHE_RESP_URL": resp_url or (server.resp_url if server else ""),
        "TORCHINDUCTOR_CACHE_DIR": _tmp("kc-ind-"),
        "KCACHE_DIR": _tmp("kc-dir-"),
        "TMPDIR": _tmp("kc-tmp-"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
    }
    e["KCACHE_TOKEN"] = token or ""
    e.update(extra)
    return e


@pytest.fixture(scope="module")
def cxx():
    """A C++ compiler wrapper that logs each compile (-c, -o, -E) to
    $KCACHE_TEST_CXX_LOG and runs g++: how a test sees that no g++ ran."""
    d = _tmp("kc-cxx-")
    path = os.path.join(d, "g++")
    with open(path, "w") as f:
        f.write(
            '#!/bin/sh\ncase " $* " in *" -c "*|*" -o "*|*" -E "*)\n'
            '  echo "$*" >> "$KCACHE_TEST_CXX_LOG";;\nesac\n'
            'exec g++ "$@"\n'
        )
    os.chmod(path, 0o755)
    return path


def cxx_env(cxx, **extra):
    log = os.path.join(_tmp("kc-cxxlog-"), "log")
    return dict(extra, CXX=cxx, KCACHE_TEST_CXX_LOG=log)


def compiles(env):
    try:
        with open(env["KCACHE_TEST_CXX_LOG"]) as f:
            return f.read().splitlines()
    except FileNotFoundError:
        return []


def misses(r):
    c = r["counters"]
    return c.get("fxgraph_cache_miss", 0) + c.get("autograd_cache_miss", 0)


def hits_only(r):
    c = r["counters"]
    assert r["equal"], r
    for k, v in HITS.items():
        assert c.get(k, 0) == v, (k, r)
    assert misses(r) == 0, r


def get_json(server, path, token=None):
    req = urllib.request.Request(server.url + path)
    if token:
        req.add_header("Authorization", "Bearer " + token)
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


# ------------------------------------------------------------ the one call


def test_service_restarts_upload_nothing_and_run_no_gxx(cxx):
    """Start 1 compiles and uploads its entries and names the model; starts
    2 and 3 (fresh processes, fresh local dirs and $TMPDIR, a write token)
    fetch every entry, upload nothing, add no miss on kcached, run no g++,
    and equal eager. A second model compiled later adds its entries and
    leaves the first model's alone."""
    s = kcserver.start_kcached(tokens=True)
    w = s.tokens["write"]
    try:
        e1 = env_for(s, w, **cxx_env(cxx))
        a = kcserver.run_worker("warm", e1, ["--name", "svc"])
        assert a["equal"] and misses(a) == 4, a
        assert compiles(e1), "the first start compiles with the wrapper"
        wa = a["warm"]
        assert wa["uploaded"] > 0 and wa["misses"] == 4, wa
        assert wa["name"] == "named", wa
        n = wa["uploaded"]
        for start in (2, 3):
            before = s.stats(w)
            e = env_for(s, w, **cxx_env(cxx))
            r = kcserver.run_worker("warm", e, ["--name", "svc"])
            hits_only(r)
            st = r["warm"]
            assert st["fetched"] == n and st["uploaded"] == 0, (start, st)
            assert st["refused"] == 0 and st["skipped"] == [], st
            assert compiles(e) == [], (start, compiles(e))
            after = s.stats(w)
            assert after["misses"] == before["misses"], (before, after)
            assert after["hits"] >= before["hits"] + n
            assert after["bundles"] == n
        models = get_json(s, "/v1/models", w)["models"]
        assert [m["name"] for m in models] == ["svc"], models
        model = models[0]["model"]
        cov = get_json(s, "/v1/models/%s/coverage" % model, w)
        assert sorted(list(b)[0] for b in cov["buckets"]) == [
            "aotautograd",
            "fxgraph",
            "kernel",
        ], cov
        assert cov["present"] == 3 and cov["expected"] == 3, cov
        # a second model, later: its own entries, the first's unchanged
        b = kcserver.run_worker(
            "warm",
            env_for(s, w, **cxx_env(cxx)),
            ["--name", "svc2", "--model", "pair2"],
        )
        assert b["equal"] and b["warm"]["uploaded"] > 0, b["warm"]
        models = {m["name"]: m for m in get_json(s, "/v1/models", w)["models"]}
        assert set(models) == {"svc", "svc2"}, models
        assert models["svc"]["bundles"] == n
    finally:
        s.cleanup()


def _two_writers():
    """kcached with tokens: read, write (CI), admin, and a second write
    token ("other")."""
    k = kcharness.Kcached(tokens=True, threads=4, prefix="kc-py-")
    out = subprocess.run(
        [kcharness.kcached_path(), "token", "write", "other"],
        capture_output=True,
        check=True,
        text=True,
    )
    body = [x for x in out.stdout.splitlines() if not x.startswith("#")]
    with open(os.path.join(k.dir, "tokens"), "a") as f:
        f.write(body[1].strip() + "\n")
    k.tokens["other"] = body[0].strip()
    return k.start()


def _entry_dir(root, files):
    for rel, data in files.items():
        p = os.path.join(root, rel)
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(data)


def test_second_writer_cannot_change_ci_entries(tmp_path):
    """CI publishes entries; a second write token then tries the same key
    with other bytes (kcached refuses: write-once), and a bundle under its
    own key that carries CI's paths, and one whose key is not what its
    entry gives (both refused by the reader). A reader then holds exactly
    CI's bytes."""
    import kcache
    from kcache.torch import entries as ke

    s = _two_writers()
    try:
        fx = "fxgraph/ab/fabcdefghijk/entry"
        ci_files = {
            "ab/cabcdefghijk.so": b"CI kernel",
            "ab/cabcdefghijk.cpp": b"CI source",
            fx: b"CI graph",
        }
        ci_dir = str(tmp_path / "ci")
        _entry_dir(ci_dir, ci_files)

        def engine(token, root, name):
            c = kcache.Client(
                url=s.url,
                token=token,
                cache_dir=str(tmp_path / ("kc-" + name)),
            )
            return ke.Entries(c, "svc-model", root, "cpu")

        ci = engine(s.tokens["write"], ci_dir, "ci")
        ci.list()
        ci.upload()
        assert ci.stats["uploaded"] == 2, ci.stats
        # the same key, other bytes: kcached refuses the bundle
        bad_dir = str(tmp_path / "other")
        _entry_dir(bad_dir, {"ab/cabcdefghijk.so": b"other kernel"})
        other = engine(s.tokens["other"], bad_dir, "other")
        f = ke.fields(
            other.model,
            "kernel",
            "ab/cabcdefghijk",
            "cpu",
            other.tools,
            other.arch,
        )
        with pytest.raises(kcache.Error):
            other.client.push_dir(bad_dir, f)
        # another key holding CI's path; a key its entry does not give
        for entry, path in (
            ("zz/czzzzzzzzzz", "ab/cabcdefghijk.so"),
            ("ab/cabcdefghijk", "ab/cabcdefghijk.so"),
        ):
            d = str(tmp_path / ("o-" + entry.replace("/", "-")))
            _entry_dir(d, {path: b"other kernel"})
            f = ke.fields(
                other.model,
                "kernel",
                entry,
                "cpu",
                other.tools,
                other.arch,
                {"forged": entry},
            )
            other.client.push_dir(d, f)
        reader_dir = str(tmp_path / "reader")
        reader = engine(s.tokens["read"], reader_dir, "reader")
        reader.fetch()
        assert reader.stats["fetched"] == 2, reader.stats
        assert reader.stats["refused"] == 2, reader.stats
        for rel, data in ci_files.items():
            with open(os.path.join(reader_dir, rel), "rb") as fh:
                assert fh.read() == data, rel
        assert ke.entry_of("ab/cabcdefghijk.py") is None  # code: never
        assert ke.entry_of("ab/czzzz.so") is None  # not its directory
    finally:
        s.cleanup()


def test_concurrent_one_upload_per_entry(cxx):
    """Two processes compile the same model at once against an empty
    kcached: each entry is uploaded once (the other finds its lease held
    or its bundle present)."""
    s = kcserver.start_kcached()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            rs = list(
                ex.map(
                    lambda _: kcserver.run_worker("warm", env_for(s)), range(2)
                )
            )
        for r in rs:
            assert r["equal"], r
        up = [r["warm"]["uploaded"] for r in rs]
        assert sum(up) == s.stats()["bundles"], (up, s.stats())
        assert all(r["warm"]["failed"] == 0 for r in rs), rs
    finally:
        s.cleanup()


def test_prepopulate_lazy_model_then_service():
    """CI prepopulates a model with a lazy module (nn.LazyLinear before its
    first forward) over two batch buckets; a service process with empty
    local caches then hits everything and uploads nothing."""
    s = kcserver.start_kcached()
    try:
        p = kcserver.run_worker(
            "prepopulate",
            env_for(s),
            ["--model", "lazy", "--name", "lazy-svc"],
        )
        assert p["buckets"] == 2 and p["warm"]["uploaded"] > 0, p
        r = kcserver.run_worker("warm", env_for(s), ["--model", "lazy"])
        hits_only(r)
        assert r["warm"]["fetched"] == p["warm"]["uploaded"], r["warm"]
        assert r["warm"]["uploaded"] == 0, r["warm"]
    finally:
        s.cleanup()


def test_torch_version_mismatch_misses(server):
    s = server
    kcserver.run_worker("warm", env_for(s))
    r = kcserver.run_worker(
        "warm", env_for(s), ["--no-upload", "--fake-torch-version", "2.12.0"]
    )
    assert r["equal"] and misses(r) == 4, r
    assert r["warm"]["fetched"] == 0 and r["warm"]["listed"] == 0, r["warm"]


def test_read_only_token(auth_server):
    """A read token is served hits (the test above's kind) and its upload
    is refused, counted, not raised."""
    ro = auth_server.tokens["read"]
    r = kcserver.run_worker(
        "warm",
        env_for(auth_server, token=ro),
        ["--fake-torch-version", "2.11.0"],
    )
    assert r["equal"] and misses(r) == 4
    assert r["warm"]["upload"] == "skipped: KC_FORBIDDEN", r["warm"]
    assert "upload: KC_FORBIDDEN" in r["warm"]["skipped"], r["warm"]


def test_kcached_down(dead_url):
    dead_resp = "redis://127.0.0.1:%d" % kcserver.free_port()
    r = kcserver.run_worker(
        "all", env_for(None, url=dead_url, resp_url=dead_resp)
    )
    assert r["equal"] and misses(r) == 4, r
    assert r["mega"]["load"].startswith("skipped: KC_UNAVAILABLE"), r["mega"]
    assert r["mega"]["fetch_s"] < 5
    assert r["mega"]["upload"].startswith("skipped: layers unknown"), r["mega"]
    w = kcserver.run_worker("warm", env_for(None, url=dead_url))
    assert w["equal"] and w["warm"]["skipped"] == ["fetch: KC_UNAVAILABLE"], w[
        "warm"
    ]
    n = kcserver.run_worker("warm", env_for(None, url=""))
    assert n["warm"]["skipped"] == ["no server"], n["warm"]
    assert n["stderr"].count("no server") == 1, n["stderr"]


# ----------------------------------------------------- the building blocks


def test_remote_caches_only(server):
    a = kcserver.run_worker("remote", env_for(server))
    assert a["equal"] and misses(a) == 4, a
    hits_only(kcserver.run_worker("remote", env_for(server)))


def test_tokens_redacted_in_what_is_returned(monkeypatch):
    """use_remote_caches (and prepopulate's report, which carries its
    lines) shows the kcached token as ***; the process environment it sets
    keeps the real one, for torch."""
    import kcache.torch as kt

    for k in (
        "TORCHINDUCTOR_REDIS_URL",
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE",
    ):
        monkeypatch.delenv(k, raising=False)
    lines = kt.use_remote_caches("redis://127.0.0.1:6379", "kc_s3cret")
    assert "kc_s3cret" not in repr(lines), lines
    assert lines["TORCHINDUCTOR_REDIS_URL"] == "redis://:***@127.0.0.1:6379"
    assert "kc_s3cret" in os.environ["TORCHINDUCTOR_REDIS_URL"]
    assert (
        kt.redact("rediss://u:p@h:1/0?ssl_ca_certs=/x")
        == "rediss://u:***@h:1/0?ssl_ca_certs=/x"
    )
    assert kt.redact("redis://h:1") == "redis://h:1"


def test_sessions_save_after_a_raising_body(server, monkeypatch, tmp_path):
    """mega_cache, cache_dir_bundle and warm are one protocol (one base
    class): each is its own context manager, loads on enter, saves on exit
    also when the body raised, and lets the body's exception through."""
    import kcache.torch as kt

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "ind"))
    # warm sets it in this process; monkeypatch puts the old value back
    monkeypatch.setenv("TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS", "0")
    for make in (kt.mega_cache, kt.cache_dir_bundle, kt.warm):
        with pytest.raises(ValueError, match="the body's"):
            with make("sessions-model", url=server.url, deadline=5) as s:
                assert isinstance(
                    s, kt.MegaCache if make is kt.mega_cache else kt.Warm
                ), type(s)
                raise ValueError("the body's")
        if make is kt.mega_cache:
            assert s.stats["load"] == "miss", s.stats
            assert s.stats["upload"] == "skipped: nothing new", s.stats
        else:
            assert s.stats["listed"] == 0 and "upload_s" in s.stats, s.stats


def test_mega_cache(server):
    a = kcserver.run_worker("mega", env_for(server))
    assert a["mega"]["load"] == "miss" and a["mega"]["upload"] == "uploaded"
    b = kcserver.run_worker("mega", env_for(server))
    hits_only(b)
    assert b["mega"]["load"] == "loaded" and b["mega"]["loaded_layers"] == 1
    assert b["mega"]["upload"] == "skipped: nothing new"


def test_corrupt_artifacts_skipped(server, tmp_path):
    """A Mega-Cache layer of garbage (verified bytes: its SHA-256 is right,
    its content is not torch's) is skipped and the model compiles."""
    import torch
    import kcache
    import kcache.torch as kt
    import torch_worker

    model = torch_worker.build_models(torch, "cpu")
    c = kcache.Client(url=server.url, cache_dir=str(tmp_path))
    opts = {"corrupt": 1}
    c.push_bytes(
        b"\x00garbage" * 1000,
        kt.key_fields("mega", model, 0, "cpu", opts),
        name="artifacts.bin",
    )
    with kt.mega_cache(
        model=model, client=c, device="cpu", options=opts, upload=False
    ) as mc:
        pass
    assert mc.stats["bad_layers"] == 1 and mc.stats["load"] == "miss"


def test_wrong_token_turns_remote_cache_off(auth_server):
    """redis-py >= 4.4: WRONGPASS is a ConnectionError; torch turns its
    remote cache off for the process and compiles."""
    import redis

    assert tuple(int(x) for x in redis.__version__.split(".")[:2]) >= (4, 4)
    bad = "redis://:kc_%s@127.0.0.1:%d" % ("0" * 64, auth_server.resp_port)
    r = kcserver.run_worker("remote", env_for(auth_server, resp_url=bad))
    assert r["equal"] and misses(r) == 4, r
    assert "Traceback" not in r["stderr"]


# ------------------------------------------------------------------- keys


def test_key_fields_bind_the_toolchain():
    """The key of a torch bundle: on the CPU, arch sm_00 and the ISA level
    in the toolchain; torch, accel, Python ABI; any change is another key."""
    import sysconfig
    import torch
    import kcache
    import kcache.torch as kt

    f = kt.key_fields("mega", "my-model", 0, "cpu")
    assert f["arch"] == "sm_00" and kcache.arch_valid(f["arch"])
    t = f["toolchain"]
    assert t == kt.toolchain("cpu")
    assert t["torch"] == str(torch.__version__) and t["accel"] == "cpu"
    assert t["python"] == sysconfig.get_config_var("SOABI")
    assert t["cpu_isa"] == kt.cpu_isa()
    assert f["bucket"] == {"layer": 0} and len(f["model"]) == 64
    k = kcache.key(f)
    for change in (
        {"cpu_isa": "other"},
        {"torch": "2.12.0"},
        {"python": "cpython-312-x86_64-linux-gnu"},
    ):
        g = dict(f, toolchain=dict(t, **change))
        assert kcache.key(g) != k, change
    assert kcache.key(kt.key_fields("mega", "my-model", 1, "cpu")) != k


_ISA_SCRIPT = """
import json, torch
import kcache.torch.keys as k
from torch._inductor import cpu_vec_isa
before = k.cpu_isa()
k._ISA = None
picked = str(cpu_vec_isa.pick_vec_isa())   # Inductor's probe compiles
after = k.cpu_isa()
print(json.dumps([before, after, picked]))
"""


def test_cpu_isa_same_before_and_after_inductor_probes():
    """cpu_isa() gives what Inductor compiles for, the same before its
    probe compiles have run in the process as after."""
    env = dict(
        os.environ,
        TORCHINDUCTOR_CACHE_DIR=_tmp("kc-isa-"),
        TMPDIR=_tmp("kc-isatmp-"),
    )
    env.setdefault("PYTHONPATH", os.path.join(kcserver.ROOT, "python"))
    p = subprocess.run(
        [sys.executable, "-c", _ISA_SCRIPT],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert p.returncode == 0, p.stderr[-3000:]
    before, after, picked = json.loads(p.stdout.strip().splitlines()[-1])
    assert before == after == picked, (before, after, picked)


def test_model_hash_reads_sources_once(monkeypatch):
    """model_hash is memoized per module and reads each class's source
    once per process: 64 keys of one model cost one hash."""
    import inspect
    import torch
    import kcache.torch as kt
    import kcache.torch.keys as keys

    calls = []
    real = inspect.getsource

    def counting(obj):
        if isinstance(obj, type) and issubclass(obj, torch.nn.Module):
            calls.append(obj)  # not torch's own reads of its modules
        return real(obj)

    monkeypatch.setattr(inspect, "getsource", counting)
    getattr(keys._class_source, "cache_clear", lambda: None)()

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = torch.nn.Linear(8, 8)
            self.b = torch.nn.Linear(8, 8)

        def forward(self, x):
            return self.b(self.a(x))

    m = Block()
    hs = {kt.model_hash(m) for _ in range(32)}
    hs |= {kt.key_fields("mega", m, n, "cpu")["model"] for n in range(32)}
    assert len(hs) == 1
    assert len(calls) == 2, calls  # Block, Linear: once each
    assert kt.model_hash(Block()) in hs  # the same model, another object


def test_lazy_module_hashes():
    """A model with a lazy module before its first forward has a hash
    (its parameters have no shape yet)."""
    import torch
    import kcache.torch as kt

    m = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    h = kt.model_hash(m)
    assert len(h) == 64
    m2 = torch.nn.Sequential(torch.nn.LazyLinear(4), torch.nn.ReLU())
    assert kt.model_hash(m2) == h


def test_deadline_bounds_a_silent_kcached(tmp_path):
    """A kcached that accepts connections and never answers: entering
    warm() and mega_cache returns at their deadline, not at the client's
    timeout; what kcached holds is then unknown, so nothing is uploaded
    (and the stats say why)."""
    import socket
    import time
    import kcache
    import kcache.torch as kt

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(16)  # never accepted: connects succeed, no answer comes
    url = "http://127.0.0.1:%d" % srv.getsockname()[1]
    old = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(tmp_path / "ind")
    # the client would wait 30 s for an answer: the deadline is what bounds
    c = kcache.Client(url=url, timeout=30, cache_dir=str(tmp_path / "kc"))
    try:
        t = time.monotonic()
        with kt.mega_cache(
            model="silent", client=c, device="cpu", deadline=1.0
        ) as mc:
            pass
        with kt.warm("silent", client=c, device="cpu", deadline=1.0) as w:
            os.makedirs(str(tmp_path / "ind" / "ab"), exist_ok=True)
            (tmp_path / "ind" / "ab" / "cabcdefghij.so").write_bytes(b"x")
        took = time.monotonic() - t
    finally:
        srv.close()
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    assert mc.stats["load"] == "skipped: deadline", mc.stats
    assert mc.stats["upload"] == "skipped: nothing new", mc.stats
    assert w.stats["skipped"] == ["fetch: deadline"], w.stats
    assert w.stats["uploaded"] == 0
    assert took < 6, took
