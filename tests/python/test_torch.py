"""test_torch: real PyTorch (torch==2.13.0, CPU: Inductor generates C++ and
compiles it with g++) compiling an MLP and an attention block with a dynamic
batch dimension through kcache. Process A compiles and fills kcached;
process B, with empty local caches (TORCHINDUCTOR_CACHE_DIR, KCACHE_DIR),
gets its hits through one path at a time, checked with torch's own
counters (torch._dynamo.utils.counters) and outputs equal to eager. Then
the failure cases: wrong token, torch-version mismatch, kcached down,
corrupt artifacts, a read-only token, and concurrent processes (one upload
per key). Each worker is a fresh process (tests/python/torch_worker.py)."""
import concurrent.futures
import os
import shutil
import tempfile

import pytest

from conftest import need
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
    """A fresh process's environment: empty local caches."""
    e = {"KCACHE_URL": server.url if server else extra.pop("url"),
         "KCACHE_RESP_URL": resp_url or (server.resp_url if server else ""),
         "TORCHINDUCTOR_CACHE_DIR": _tmp("kc-ind-"),
         "KCACHE_DIR": _tmp("kc-dir-"),
         "TORCHINDUCTOR_COMPILE_THREADS": "1"}
    e["KCACHE_TOKEN"] = token or ""
    e.update(extra)
    return e


def misses(r):
    c = r["counters"]
    return c.get("fxgraph_cache_miss", 0) + c.get("autograd_cache_miss", 0)


def hits_only(r):
    c = r["counters"]
    assert r["equal"], r
    for k, v in HITS.items():
        assert c.get(k, 0) == v, (k, r)
    assert misses(r) == 0, r


@pytest.fixture(scope="module")
def filled(server):
    """Process A of each path, run once per module (on first use)."""
    done = {}

    def get(path):
        if path not in done:
            r = kcserver.run_worker(path, env_for(server))
            assert r["equal"] and misses(r) == 4, r
            done[path] = r
        return done[path]
    return get


def test_remote_caches_only(server, filled):
    filled("remote")
    hits_only(kcserver.run_worker("remote", env_for(server)))


def test_mega_cache(server, filled):
    a = filled("mega")
    assert a["mega"]["load"] == "miss" and a["mega"]["upload"] == "uploaded"
    b = kcserver.run_worker("mega", env_for(server))
    hits_only(b)
    assert b["mega"]["load"] == "loaded" and b["mega"]["loaded_layers"] == 1
    assert b["mega"]["upload"] == "skipped: nothing new"


def test_cache_dir_bundle(server, filled):
    a = filled("cachedir")
    assert a["cachedir"]["inductor-dir"]["upload"] == "uploaded"
    b = kcserver.run_worker("cachedir", env_for(server))
    hits_only(b)
    st = b["cachedir"]["inductor-dir"]
    assert st["load"] == "loaded" and st["files"] > 0
    assert st["upload"] == "skipped: nothing new", st


def test_torch_version_mismatch_misses(server, filled):
    filled("mega")
    filled("cachedir")
    for path in ("mega", "cachedir"):
        r = kcserver.run_worker(path, env_for(server), ["--no-upload",
                                "--fake-torch-version", "2.12.0"])
        assert r["equal"] and misses(r) == 4, r
        st = r["mega"] if path == "mega" else r["cachedir"]["inductor-dir"]
        assert st["load"] == "miss", st


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
    c.push_bytes(b"\x00garbage" * 1000,
                 kt.key_fields("mega", model, 0, "cpu", opts),
                 name="artifacts.bin")
    with kt.mega_cache(model=model, client=c, device="cpu", options=opts,
                       upload=False) as mc:
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


def test_read_only_token(auth_server):
    w, ro = auth_server.tokens["write"], auth_server.tokens["read"]
    a = kcserver.run_worker("mega", env_for(auth_server, token=w))
    assert a["mega"]["upload"] == "uploaded", a
    b = kcserver.run_worker("mega", env_for(auth_server, token=ro))
    hits_only(b)  # hits served
    c = kcserver.run_worker("mega", env_for(auth_server, token=ro),
                            ["--fake-torch-version", "2.12.0"])
    assert c["equal"] and misses(c) == 4
    assert c["mega"]["upload"] == "skipped: KC_FORBIDDEN", c["mega"]


def test_kcached_down(dead_url):
    dead_resp = "redis://127.0.0.1:%d" % kcserver.free_port()
    r = kcserver.run_worker("all", env_for(None, url=dead_url,
                                           resp_url=dead_resp))
    assert r["equal"] and misses(r) == 4, r
    assert r["mega"]["load"].startswith("skipped: KC_UNAVAILABLE"), r["mega"]
    assert r["mega"]["fetch_s"] < 5
    st = r["cachedir"]["inductor-dir"]
    assert st["load"].startswith("skipped: KC_UNAVAILABLE"), st


def test_concurrent_one_upload_per_key():
    """Two processes compile the same model at once against an empty
    kcached: one uploads each kind, the other finds the lease held (or the
    bundle present) and skips."""
    s = kcserver.start_kcached()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            rs = list(ex.map(lambda _: kcserver.run_worker(
                "all", env_for(s, resp_url="redis://127.0.0.1:1")), range(2)))
        for r in rs:
            assert r["equal"], r
        mega = [r["mega"]["upload"] for r in rs]
        cdir = [r["cachedir"]["inductor-dir"]["upload"] for r in rs]
        assert mega.count("uploaded") == 1, mega
        assert cdir.count("uploaded") == 1, cdir
        # the other: the lease held or the bundle present by then, or it
        # started after the upload and loaded it (nothing new)
        assert all(u == "uploaded" or u.startswith("skipped: lease") or
                   u == "skipped: nothing new" for u in mega + cdir), \
            (mega, cdir)
    finally:
        s.cleanup()


def test_prepopulate_then_service():
    """CI prepopulates (two batch buckets, remote caches on) into an empty
    kcached; a service process with empty local caches then hits through
    all three kinds, and uploads nothing."""
    s = kcserver.start_kcached()
    try:
        p = kcserver.run_worker("prepopulate", env_for(s))
        assert p["buckets"] == 2 and p["counters"]["fxgraph_cache_miss"] == 2
        assert p["mega"]["upload"] == "uploaded", p["mega"]
        assert p["cache_dir"]["inductor-dir"]["upload"] == "uploaded"
        assert s.stats()["kv_keys"] > 0  # the remote caches' entries
        r = kcserver.run_worker("all", env_for(s))
        hits_only(r)
        assert r["mega"]["load"] == "loaded"
        assert r["cachedir"]["inductor-dir"]["load"] == "loaded"
        assert r["mega"]["upload"] == "skipped: nothing new"
    finally:
        s.cleanup()


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
    assert t["torch"] == str(torch.__version__) and t["accel"] == "cpu"
    assert t["python"] == sysconfig.get_config_var("SOABI")
    assert t["cpu_isa"] == str(torch.backends.cpu.get_cpu_capability()).lower()
    assert f["bucket"] == {"layer": 0} and len(f["model"]) == 64
    k = kcache.key(f)
    for change in ({"cpu_isa": "avx512"}, {"torch": "2.12.0"},
                   {"python": "cpython-312-x86_64-linux-gnu"}):
        g = dict(f, toolchain=dict(t, **change))
        assert kcache.key(g) != k, change
    assert kcache.key(kt.key_fields("mega", "my-model", 1, "cpu")) != k
    assert kcache.key(kt.key_fields("inductor-dir", "my-model", 0, "cpu")) != k


def test_deadline_bounds_a_silent_kcached(tmp_path):
    """A kcached that accepts connections and never answers: entering
    mega_cache and cache_dir_bundle returns at their deadline, not at the
    client's timeout; the layers are then unknown, so nothing is uploaded."""
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
        with kt.mega_cache(model="silent", client=c, device="cpu",
                           deadline=1.0) as mc:
            pass
        with kt.cache_dir_bundle(model="silent", client=c, device="cpu",
                                 deadline=1.0) as cd:
            (tmp_path / "ind" / "new.bin").write_bytes(b"x")
        took = time.monotonic() - t
    finally:
        srv.close()
        if old is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = old
    assert mc.stats["load"] == "skipped: deadline", mc.stats
    assert cd.stats["inductor-dir"]["load"] == "skipped: deadline"
    assert cd.stats["inductor-dir"]["upload"] == "skipped: 32 layers"
    assert took < 6, took
