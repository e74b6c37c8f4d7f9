"""test_client: kcache.Client over libkcache against a real kcached: keys
as the C library computes them, bundles of bytes and directories, lookup,
leases, warm, and errors carrying the C error's name."""

import json
import os

import pytest

import kcache

FIELDS = {
    "model": "a" * 64,
    "build": "b" * 64,
    "arch": "sm_90",
    "bucket": {"layer": 0},
    "toolchain": {"torch": "2.13.0"},
}


def fields(**kw):
    f = json.loads(json.dumps(FIELDS))
    f.update(kw)
    return f


def test_key_is_the_c_librarys():
    # the committed vector of docs/DESIGN.md's canonical form
    canon = kcache.canonical_key_json(FIELDS)
    assert canon == (
        '{"arch":"sm_90","bucket":{"layer":0},"build":"%s",'
        '"model":"%s","toolchain":{"torch":"2.13.0"},"v":1}'
        % ("b" * 64, "a" * 64)
    )
    assert kcache.key(FIELDS) == kcache.sha256_hex(canon.encode())
    assert kcache.key(fields(arch="sm_80")) != kcache.key(FIELDS)
    with pytest.raises(kcache.InvalidArgument) as e:
        kcache.key(fields(arch="cpu"))
    assert e.value.name == "KC_BAD_KEY" and "arch" in e.value.message


def test_bytes_round_trip_and_lookup(server, tmp_path):
    c = kcache.Client(url=server.url, cache_dir=str(tmp_path / "a"))
    data = os.urandom(100000)
    m = c.push_bytes(data, FIELDS, name="artifacts.bin")
    assert m.key == kcache.key(FIELDS) and m.bytes == len(data)
    # a second client with an empty local cache gets the same bytes
    c2 = kcache.Client(url=server.url, cache_dir=str(tmp_path / "b"))
    assert c2.pull_bytes(m.key) == data
    other = kcache.key(fields(bucket={"layer": 1}))
    found = c2.lookup([m.key, other])
    assert found[m.key] is not None and found[m.key].key == m.key
    assert found[other] is None
    with pytest.raises(kcache.NotFound) as e:
        c2.pull(other)
    assert e.value.name == "KC_NOT_FOUND" and e.value.wire == "not_found"
    # write-once: different bytes under the same key conflict
    with pytest.raises(kcache.Conflict):
        c.push_bytes(b"other", FIELDS, name="artifacts.bin")


def test_pull_many_one_batch(server, tmp_path, dead_url):
    """pull_many: the bundles kcached holds, every blob verified and in the
    local cache (readable with no server after), None for a key it lacks;
    kcached down raises and leaves nothing."""
    c = kcache.Client(url=server.url, cache_dir=str(tmp_path / "a"))
    want = {}
    for n in range(5):
        data = os.urandom(3000 + n * 70000)
        want[
            c.push_bytes(
                data, fields(bucket={"layer": 10 + n}), name="f%d.bin" % n
            ).key
        ] = data
    missing = kcache.key(fields(bucket={"layer": 99}))
    c2 = kcache.Client(url=server.url, cache_dir=str(tmp_path / "b"))
    got = c2.pull_many(list(want) + [missing])
    assert got[missing] is None
    off = kcache.Client(url="", cache_dir=str(tmp_path / "b"))
    for k, data in want.items():
        assert got[k] is not None and got[k].key == k
        assert off.cached(k) is not None
        assert off.pull_bytes(k) == data
    assert c2.pull_many([]) == {}
    down = kcache.Client(url=dead_url, cache_dir=str(tmp_path / "c"))
    with pytest.raises(kcache.Unavailable):
        down.pull_many(list(want))


def test_dir_round_trip(server, tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "a.cubin").write_bytes(b"\x7fELF" + os.urandom(64))
    (src / "sub" / "b.json").write_text('{"x": 1}')
    c = kcache.Client(url=server.url, cache_dir=str(tmp_path / "cache"))
    f = fields(bucket={"layer": 7})
    m = c.push_dir(src, f)
    assert sorted(x["path"] for x in m.files) == ["a.cubin", "sub/b.json"]
    c2 = kcache.Client(url=server.url, cache_dir=str(tmp_path / "cache2"))
    dst = tmp_path / "dst"
    c2.pull_dir(m.key, dst)
    assert (dst / "a.cubin").read_bytes() == (src / "a.cubin").read_bytes()
    assert (dst / "sub" / "b.json").read_text() == '{"x": 1}'
    assert c2.cached(m.key) is not None


def test_lease(server, tmp_path):
    c = kcache.Client(url=server.url, cache_dir=str(tmp_path), holder="py-a")
    k = kcache.key(fields(bucket={"layer": 3}))
    a = c.lease_take(k, 60)
    assert a.state == "granted" and a.token
    b = kcache.Client(
        url=server.url, cache_dir=str(tmp_path), holder="py-b"
    ).lease_take(k, 60)
    assert b.state == "held" and not b.granted
    c.lease_release(a)
    c.push_bytes(b"x", fields(bucket={"layer": 3}))
    assert c.lease_take(k, 60).state == "present"


def test_errors_carry_the_c_name(dead_url, tmp_path):
    c = kcache.Client(url=dead_url, cache_dir=str(tmp_path), timeout=2)
    with pytest.raises(kcache.Unavailable) as e:
        c.pull(kcache.key(FIELDS))
    assert e.value.name == "KC_UNAVAILABLE" and e.value.code == 26
    assert str(e.value).startswith("KC_UNAVAILABLE: ")
    assert isinstance(e.value, kcache.Error)


def test_env_vars_as_the_cli(server, tmp_path, monkeypatch):
    monkeypatch.setenv("KCACHE_URL", server.url)
    monkeypatch.setenv("KCACHE_DIR", str(tmp_path / "envdir"))
    monkeypatch.setenv("KCACHE_TIMEOUT", "5")
    c = kcache.Client()
    assert c.url == server.url and c.has_server
    assert c.cache_dir == str(tmp_path / "envdir")
    monkeypatch.setenv("KCACHE_TIMEOUT", "soon")
    with pytest.raises(kcache.InvalidArgument):
        kcache.Client()


def test_read_token_cannot_upload(auth_server, tmp_path):
    w = kcache.Client(
        url=auth_server.url,
        token=auth_server.tokens["write"],
        cache_dir=str(tmp_path / "w"),
    )
    m = w.push_bytes(b"hello", FIELDS)
    r = kcache.Client(
        url=auth_server.url,
        token=auth_server.tokens["read"],
        cache_dir=str(tmp_path / "r"),
    )
    assert r.pull_bytes(m.key) == b"hello"
    with pytest.raises(kcache.Forbidden) as e:
        r.push_bytes(b"other", fields(bucket={"layer": 2}))
    assert e.value.name == "KC_FORBIDDEN"
    bad = kcache.Client(
        url=auth_server.url,
        token="kc_" + "0" * 64,
        cache_dir=str(tmp_path / "x"),
    )
    with pytest.raises(kcache.Unauthorized):
        bad.pull(m.key)


def test_warm_report(server, tmp_path):
    """kc_warm through the binding: the command builder builds each key once,
    a second warm from an empty local cache fetches them (hit-remote)."""
    script = tmp_path / "build.sh"
    script.write_text('#!/bin/sh\necho "batch $1" > "$2/k.bin"\n')
    script.chmod(0o755)
    manifest = {
        "schema": "kcache.warmup/v1",
        "model": {"name": "py-warm", "hash": "c" * 64},
        "archs": ["sm_90"],
        "toolchain": {"torch": "2.13.0"},
        "builder": {"command": [str(script), "{batch}", "{out}"]},
        "buckets": [{"batch": 1}, {"batch": 2}],
    }
    c = kcache.Client(url=server.url, cache_dir=str(tmp_path / "a"))
    rep = c.warm(manifest, out=str(tmp_path / "out"), deadline=60)
    assert rep["error"] is None, rep
    assert rep["counts"]["built"] == 2
    assert (
        tmp_path / "out" / "sm_90" / "batch=2" / "k.bin"
    ).read_text() == "batch 2\n"
    c2 = kcache.Client(url=server.url, cache_dir=str(tmp_path / "b"))
    rep2 = c2.warm(manifest, deadline=60, no_build=True)
    assert rep2["counts"]["hit-remote"] == 2 and rep2["error"] is None
    assert [i["status"] for i in rep2["items"]] == ["hit-remote"] * 2


def test_abi_checked_at_import(monkeypatch):
    """The structs the package mirrors have the library's sizes, and a
    library of another ABI is refused at import with what differs (a
    wrong layout would be read and written silently)."""
    import ctypes
    from kcache import _lib

    for name, t in _lib._MIRRORS.items():
        assert _lib.lib.kc_abi_sizeof(name.encode()) == ctypes.sizeof(t), name
    assert _lib.lib.kc_abi_sizeof(b"no_such_struct") == 0
    monkeypatch.setattr(_lib, "ABI_VERSION", _lib.ABI_VERSION + 1)
    with pytest.raises(ImportError, match="ABI"):
        _lib._check_abi()
    monkeypatch.setattr(_lib, "ABI_VERSION", _lib.ABI_VERSION - 1)

    class Short(ctypes.Structure):
        _fields_ = [("x", ctypes.c_int)]

    monkeypatch.setitem(_lib._MIRRORS, "kc_warm_report", Short)
    with pytest.raises(ImportError, match="kc_warm_report"):
        _lib._check_abi()


def test_library_exports_only_the_public_api():
    """libkcache.so exports the kc_ API, not its internals (kcc_, kcw_,
    kci_, kcg_) nor the static libraries linked into it."""
    import shutil
    import subprocess
    from kcache import _lib

    nm = shutil.which("nm")
    if not nm:
        pytest.skip("no nm")
    out = subprocess.run(
        [nm, "-D", "--defined-only", _lib.LIB_PATH],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    names = [l.split()[-1] for l in out.splitlines() if l.strip()]
    assert "kc_warm" in names and "kc_free" in names
    assert [n for n in names if not n.startswith("kc_")] == []
