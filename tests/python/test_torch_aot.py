"""test_torch_aot: kcache.torch.compile's compiled artifacts (AOTInductor
packages per shape bucket) with real PyTorch (torch==2.13.0, CPU: g++).
A CI process publishes the test model's buckets to a real kcached; fresh
service processes (empty KCACHE_DIR, TORCHINDUCTOR_CACHE_DIR and $TMPDIR)
load them through torch's C++ loader without importing the compile stack,
and every output is compared with eager. Then: a bucket without an
artifact, an ISA or toolchain mismatch, foreign and corrupt artifacts,
kcached down, and two replicas racing for one build. Each worker is a fresh
process (tests/python/aot_worker.py)."""

import concurrent.futures
import json
import os
import shutil
import tempfile

import pytest

from conftest import need
import kcserver

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "aot_worker.py")
_DIRS = []


@pytest.fixture(scope="module", autouse=True)
def torch_present():
    need("torch")
    yield
    for d in _DIRS:
        shutil.rmtree(d, ignore_errors=True)


def _tmp(prefix):
    d = tempfile.mkdtemp(prefix=prefix)
    _DIRS.append(d)
    return d


def run(url, *args, env=None, timeout=600):
    """aot_worker.py in a fresh process with fresh caches; its RESULT."""
    e = {
        "KCACHE_URL": url,
        "KCACHE_DIR": _tmp("kc-aot-dir-"),
        "TORCHINDUCTOR_CACHE_DIR": _tmp("kc-aot-ind-"),
        "TMPDIR": _tmp("kc-aot-tmp-"),
        "TORCHINDUCTOR_COMPILE_THREADS": "1",
        "ATEN_CPU_CAPABILITY": None,
    }
    e.update(env or {})
    return kcserver.run_script(WORKER, args, e, timeout=timeout)


def states(r):
    return [
        b["state"]
        for _, b in sorted(
            r["stats"]["buckets"].items(), key=lambda kv: int(kv[0])
        )
    ]


@pytest.fixture(scope="module")
def published(server):
    """CI: the test model's buckets (batch 1..4, 5..16) built and uploaded."""
    r = run(server.url, "--mode", "publish", "--name", "main")
    assert [b["state"] for b in r["publish"]["buckets"]] == ["built"] * 2, r
    assert [b["range"] for b in r["publish"]["buckets"]] == [[1, 4], [5, 16]]
    return r["publish"]


def test_served_to_a_fresh_process_at_the_floor(server, published):
    r = run(
        server.url, "--name", "main", "--no-build", "--check", "1,3,4,5,9,16"
    )
    assert states(r) == ["loaded", "loaded"], r
    assert r["equal"], r
    assert r["equal_strided"], r  # non-contiguous inputs: the same outputs
    # the C++ loader only: neither Dynamo nor Inductor imported
    assert r["compile_stack"] == [], r
    assert {b["key"] for b in r["stats"]["buckets"].values()} == {
        b["key"] for b in published["buckets"]
    }


def test_a_bucket_without_artifact_falls_back(server, published):
    r = run(
        server.url,
        "--name",
        "main",
        "--no-build",
        "--buckets",
        "4,16,32",
        "--check",
        "3,9,20,32,40",
    )
    assert states(r) == ["loaded", "loaded", "fallback"], r
    assert r["equal"], r
    assert "torch._dynamo" in r["compile_stack"], r  # torch.compile ran


@pytest.mark.parametrize(
    "env,args",
    [
        ({"ATEN_CPU_CAPABILITY": "default"}, []),  # a CPU without the ISA
        ({}, ["--fake-torch-version", "2.99.0"]),  # another torch
    ],
)
def test_isa_or_toolchain_mismatch_is_a_miss(server, published, env, args):
    if env and published["isa"] == "none":
        pytest.skip("Inductor picked no vector ISA here: nothing to lack")
    r = run(
        server.url,
        "--name",
        "main",
        "--no-build",
        "--fallback",
        "eager",
        "--check",
        "3,9",
        *args,
        env=env,
    )
    assert states(r) == ["fallback", "fallback"], r
    assert not any("reason" in b for b in r["stats"]["buckets"].values())
    assert r["equal"], r


def test_host_isa_labels_follow_the_capability_cap(monkeypatch):
    need("torch")
    from kcache.torch import aot

    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    labels = aot.host_isa_labels()
    assert labels[-1] == "none"
    assert not any("avx512" in lb for lb in labels), labels
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    assert aot.host_isa_labels() == ["none"]
    # a package's own ISA metadata against what this CPU runs
    assert not aot._runnable("AVX512 AVX512_VNNI", ["avx2", "none"])
    assert aot._runnable("AVX2", ["avx512", "avx2", "none"])
    assert aot._runnable("", ["none"])


def test_foreign_and_corrupt_artifacts_are_refused(server, published):
    from kcache import Client

    keys = run(
        server.url,
        "--mode",
        "keys",
        "--name",
        "forged",
        "--isa",
        published["isa"],
    )
    c = Client(url=server.url)
    src = [_tmp("kc-aot-src-") for _ in range(2)]
    for d, b in zip(src, published["buckets"]):
        c.pull_dir(b["key"], d)
    # bucket 0's key: the package of bucket 1 (another bucket's, intact)
    c.push_dir(src[1], keys["fields"][0])
    # bucket 1's key: its own meta made to match, the package truncated
    pt2 = os.path.join(src[1], "model.pt2")
    with open(pt2, "rb") as f:
        data = f.read()
    with open(pt2, "wb") as f:
        f.write(data[: len(data) // 2])
    meta_p = os.path.join(src[1], "meta.json")
    with open(meta_p) as f:
        meta = json.load(f)
    import hashlib

    meta["fields"] = keys["fields"][1]
    meta["pt2_sha256"] = hashlib.sha256(data[: len(data) // 2]).hexdigest()
    with open(meta_p, "w") as f:
        json.dump(meta, f)
    c.push_dir(src[1], keys["fields"][1])
    r = run(
        server.url, "--name", "forged", "--fallback", "eager", "--check", "3,9"
    )
    bs = r["stats"]["buckets"]
    assert "foreign" in bs["0"].get("reason", ""), r
    assert "not a package" in bs["1"].get("reason", ""), r
    # refused, never built over (bundles are write-once), served eagerly
    assert states(r) == ["fallback", "fallback"], r
    assert r["stats"]["built"] == 0
    assert r["equal"], r


def test_kcached_down_compiles_normally(dead_url):
    r = run(dead_url, "--buckets", "4", "--check", "3", "--deadline", "3")
    assert states(r) == ["fallback"], r
    assert r["stats"]["reason"].startswith("fetch:"), r
    assert "torch._dynamo" in r["compile_stack"], r
    assert r["equal"], r


def test_concurrent_replicas_build_once():
    s = kcserver.start_kcached()
    try:
        with concurrent.futures.ThreadPoolExecutor(2) as ex:
            fs = [
                ex.submit(
                    run,
                    s.url,
                    "--name",
                    "race",
                    "--buckets",
                    "4",
                    "--check",
                    "2,4",
                    "--build-wait",
                    "400",
                    "--fallback",
                    "eager",
                )
                for _ in range(2)
            ]
            rs = [f.result() for f in fs]
    finally:
        s.cleanup()
    assert sorted(r["stats"]["built"] for r in rs) == [0, 1], rs
    waiter = [r for r in rs if r["stats"]["built"] == 0][0]
    assert states(waiter) == ["loaded"], waiter
    assert waiter["stats"]["buckets"]["0"].get("waited"), waiter
    assert all(r["equal"] for r in rs), rs
