"""client: kcache.Client, a thin binding of libkcache's kc_client.

Everything that talks to kcached, verifies bytes or touches the local cache
is libkcache's: this module only converts arguments and results. A Client
serializes its own calls (libkcache's handle is one thread at a time), and
ctypes releases the GIL while the C code runs, so other Python threads go on.
"""

from __future__ import annotations

import ctypes
import json
import os
import tempfile
import threading
from ctypes import byref, c_char_p, c_int, c_size_t, c_void_p
from dataclasses import dataclass
from typing import (
    Any,
    Dict,
    Iterable,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from . import _lib
from .errors import Error, InvalidArgument, check, make_error

_lib.curl_init()

PathLike = Union[str, "os.PathLike[str]"]
KeyFieldsLike = Mapping[str, Any]


def _fields(fields: KeyFieldsLike) -> _lib.KeyFields:
    """Key fields from a mapping ({"model","bucket","arch","toolchain",
    "build"}), validated by the C parser (kc_key_fields_parse)."""
    text = json.dumps(dict(fields), sort_keys=True).encode()
    out = _lib.KeyFields()
    err = _lib.errbuf()
    _lib.lib.kc_key_fields_parse(text, len(text), byref(out), err)
    return out


def key(fields: KeyFieldsLike) -> str:
    """The bundle key (64 hex) of key fields: SHA-256 of their canonical JSON
    (docs/DESIGN.md, "The key"), computed by libkcache."""
    f = _fields(fields)
    out = ctypes.create_string_buffer(_lib.HEX_LEN + 1)
    err = _lib.errbuf()
    _lib.lib.kc_key_compute(byref(f), out, err)
    return out.value.decode()


def canonical_key_json(fields: KeyFieldsLike) -> str:
    """The canonical key JSON the key is the hash of."""
    f = _fields(fields)
    p = c_void_p()
    err = _lib.errbuf()
    _lib.lib.kc_key_canonical(byref(f), byref(p), err)
    return _lib.take_string(p)


def sha256_hex(data: bytes) -> str:
    """SHA-256 of data as 64 lowercase hex digits (libkcache's)."""
    out = ctypes.create_string_buffer(_lib.HEX_LEN + 1)
    _lib.lib.kc_sha256_hex(data, len(data), out)
    return out.value.decode()


def model_hash(paths: Sequence[PathLike]) -> str:
    """kcache's model identity of files (weights, config): kc_model_hash."""
    arr = (c_char_p * len(paths))(*[os.fsencode(p) for p in paths])
    out = ctypes.create_string_buffer(_lib.HEX_LEN + 1)
    err = _lib.errbuf()
    _lib.lib.kc_model_hash(arr, len(paths), out, err)
    return out.value.decode()


def arch_valid(arch: str) -> bool:
    """True when arch is a valid key arch (^(sm|compute)_[0-9]{2,3}[af]?$)."""
    return bool(_lib.lib.kc_arch_valid(arch.encode()))


class Manifest:
    """A bundle manifest held by libkcache (kc_manifest), freed with this
    object. `data` is its canonical JSON parsed: key, fields, files."""

    def __init__(self, ptr: int):
        self._ptr = ptr
        p = c_void_p()
        err = _lib.errbuf()
        _lib.lib.kc_manifest_to_json(ptr, byref(p), err)
        self.json: str = _lib.take_string(p)
        self.data: Dict[str, Any] = json.loads(self.json)

    @classmethod
    def parse(cls, text: Union[str, bytes]) -> "Manifest":
        """Parse and validate a manifest (kc_manifest_parse): paths safe,
        key equal to the fields' key."""
        raw = text.encode() if isinstance(text, str) else text
        p = c_void_p()
        err = _lib.errbuf()
        _lib.lib.kc_manifest_parse(raw, len(raw), byref(p), err)
        return cls(p.value)

    @property
    def key(self) -> str:
        return str(self.data["key"])

    @property
    def files(self) -> List[Dict[str, Any]]:
        return list(self.data["files"])

    @property
    def bytes(self) -> int:
        """The sum of its files' sizes."""
        return sum(int(f["size"]) for f in self.data["files"])

    def __del__(self) -> None:
        ptr, self._ptr = getattr(self, "_ptr", None), None
        if ptr:
            _lib.lib.kc_manifest_free(ptr)

    def __repr__(self) -> str:
        return "<kcache.Manifest %s, %d files>" % (
            self.key[:12],
            len(self.data["files"]),
        )


@dataclass
class Lease:
    """The answer to a lease request: state is "granted" (token is ours:
    build, upload, release), "present" (the bundle exists) or "held"
    (another holder builds it; retry_after_s says when to look again)."""

    key: str
    state: str
    token: str
    retry_after_s: int

    @property
    def granted(self) -> bool:
        return self.state == "granted"


_LEASE_STATES = ("granted", "present", "held")


def _env(name: str) -> Optional[str]:
    v = os.environ.get(name)
    return v if v else None


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "") in ("1", "true", "yes")


class Client:
    """A client of kcached and of the local cache ($KCACHE_DIR).

    Arguments left None come from the environment, as for the kcache CLI:
    KCACHE_URL, KCACHE_TOKEN, KCACHE_CACERT, KCACHE_DIR, KCACHE_TIMEOUT
    (seconds, whole request), KCACHE_ALLOW_PLAINTEXT=1, KCACHE_TRUST_DIR=1.
    No URL (None and KCACHE_URL unset, or ""): the local cache only.

    connect_timeout and timeout are seconds (floats). A Client may be used
    from several threads; its calls are serialized. close() (or `with`)
    frees the C handle; garbage collection does too.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        token: Optional[str] = None,
        cache_dir: Optional[PathLike] = None,
        timeout: Optional[float] = None,
        connect_timeout: Optional[float] = None,
        cacert: Optional[PathLike] = None,
        parallel: int = 0,
        holder: Optional[str] = None,
        allow_plaintext: Optional[bool] = None,
        trust_cache_dir: Optional[bool] = None,
    ):
        self._lock = threading.Lock()
        self._c: Optional[int] = None
        if url is None:
            url = _env("KCACHE_URL")
        if token is None:
            token = _env("KCACHE_TOKEN")
        if cacert is None:
            cacert = _env("KCACHE_CACERT")
        if cache_dir is None:
            cache_dir = _env("KCACHE_DIR")
        if timeout is None and _env("KCACHE_TIMEOUT"):
            try:
                timeout = float(os.environ["KCACHE_TIMEOUT"])
            except ValueError:
                raise InvalidArgument(
                    1,
                    "KC_EINVAL",
                    "bad_request",
                    "KCACHE_TIMEOUT: invalid value '%s'"
                    % os.environ["KCACHE_TIMEOUT"],
                )
        if allow_plaintext is None:
            allow_plaintext = _env_flag("KCACHE_ALLOW_PLAINTEXT")
        if trust_cache_dir is None:
            trust_cache_dir = _env_flag("KCACHE_TRUST_DIR")
        self.url = url or ""
        self.token = token
        o = _lib.ClientOpts()
        o.url = _lib.b(self.url)
        o.token = _lib.b(token)
        o.cacert = None if cacert is None else os.fsencode(cacert)
        o.cache_dir = None if cache_dir is None else os.fsencode(cache_dir)
        o.connect_timeout_ms = (
            int(connect_timeout * 1000) if connect_timeout else 0
        )
        o.timeout_ms = max(1, int(timeout * 1000)) if timeout else 0
        o.parallel = parallel
        o.holder = _lib.b(holder)
        o.allow_plaintext = int(bool(allow_plaintext))
        o.trust_cache_dir = int(bool(trust_cache_dir))
        p = c_void_p()
        err = _lib.errbuf()
        _lib.lib.kc_client_new(byref(o), byref(p), err)
        self._c = p.value

    # ---- lifetime ----
    def close(self) -> None:
        """Frees the C handle (flushing demand notes, at most 1 s)."""
        with self._lock:
            c, self._c = self._c, None
        if c:
            _lib.lib.kc_client_free(c)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _h(self) -> int:
        if not self._c:
            raise make_error(1, "the client is closed")
        return self._c

    @property
    def cache_dir(self) -> str:
        """The local cache directory in use."""
        with self._lock:
            return _lib.lib.kc_client_cache_dir(self._h()).decode()

    @property
    def has_server(self) -> bool:
        with self._lock:
            return bool(_lib.lib.kc_client_has_server(self._h()))

    # ---- keys ----
    @staticmethod
    def key(fields: KeyFieldsLike) -> str:
        """The key of fields ({"model","bucket","arch","toolchain","build"})."""
        return key(fields)

    # ---- bundles ----
    def pull(self, key: str) -> Manifest:
        """The bundle of key, from the local cache or kcached (every blob
        fetched in one batch where kcached can, verified, stored in the local
        cache). NotFound when neither has it."""
        p = c_void_p()
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_client_pull(self._h(), key.encode(), byref(p), err)
        return Manifest(p.value)

    def cached(self, key: str) -> Optional[Manifest]:
        """The bundle from the local cache only (re-hashed), or None."""
        p = c_void_p()
        err = _lib.errbuf()
        with self._lock:
            rc = _lib.lib.kc_cache_bundle_get(
                self._h(), key.encode(), byref(p), err
            )
        if rc != 0:
            return None
        return Manifest(p.value)

    def push(self, manifest: Manifest) -> None:
        """Uploads every blob of manifest from the local cache, then the
        manifest. An identical bundle already there is a success; a
        different one is Conflict (bundles are write-once)."""
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_client_push(self._h(), manifest._ptr, err)

    def lookup(self, keys: Iterable[str]) -> Dict[str, Optional[Manifest]]:
        """One POST /v1/lookup: each key's manifest, or None when missing."""
        ks = list(keys)
        out: Dict[str, Optional[Manifest]] = {}
        for i in range(0, len(ks), 4096):
            part = ks[i : i + 4096]
            arr = (c_char_p * len(part))(*[k.encode() for k in part])
            found = (c_void_p * len(part))()
            err = _lib.errbuf()
            with self._lock:
                _lib.lib.kc_client_lookup(
                    self._h(), arr, len(part), found, err
                )
            for k, p in zip(part, found):
                out[k] = Manifest(p) if p else None
        return out

    def pull_many(self, keys: Iterable[str]) -> Dict[str, Optional[Manifest]]:
        """Many bundles at once, as kc_warm fetches: one lookup for their
        manifests, then every blob in one parallel batch, verified, into the
        local cache. Each key's manifest, or None when kcached lacks it or a
        blob failed. The local cache is not looked at first: pass the keys
        you lack. A lookup or transfer failure raises (what arrived before
        it stays in the local cache)."""
        ks = list(keys)
        arr = (c_char_p * max(1, len(ks)))(*[k.encode() for k in ks])
        got = (c_void_p * max(1, len(ks)))()
        err = _lib.errbuf()
        with self._lock:
            rc = _lib.lib.kc_client_pull_many(
                self._h(), arr, len(ks), got, err
            )
        out = {k: Manifest(p) if p else None for k, p in zip(ks, got)}
        check(rc, err)
        return out

    def materialize(self, manifest: Manifest, directory: PathLike) -> None:
        """Writes every file of manifest (its blobs in the local cache) under
        directory, verified, atomically, never outside it."""
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_materialize(
                self._h(), manifest._ptr, os.fsencode(directory), err
            )

    def file_bytes(self, manifest: Manifest, path: str) -> bytes:
        """The verified bytes of one file of manifest, from the local cache."""
        p = c_void_p()
        n = c_size_t()
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_bundle_file_bytes(
                self._h(),
                manifest._ptr,
                path.encode(),
                byref(p),
                byref(n),
                err,
            )
        return _lib.take_bytes(p, n.value)

    def bundle_from_dir(
        self,
        directory: PathLike,
        fields: KeyFieldsLike,
        skip: Optional[str] = None,
    ) -> Manifest:
        """A sealed manifest of every regular file under directory (blobs
        stored in the local cache), with fields; skip (relative) left out."""
        f = _fields(fields)
        p = c_void_p()
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_bundle_from_dir(
                self._h(),
                os.fsencode(directory),
                _lib.b(skip),
                byref(f),
                byref(p),
                err,
            )
        return Manifest(p.value)

    # ---- directories and bytes as bundles ----
    def push_dir(
        self,
        directory: PathLike,
        fields: KeyFieldsLike,
        skip: Optional[str] = None,
    ) -> Manifest:
        """bundle_from_dir, then push. Returns the manifest pushed."""
        m = self.bundle_from_dir(directory, fields, skip)
        self.push(m)
        return m

    def pull_dir(self, key: str, directory: PathLike) -> Manifest:
        """pull, then materialize into directory."""
        m = self.pull(key)
        self.materialize(m, directory)
        return m

    def push_bytes(
        self, data: bytes, fields: KeyFieldsLike, name: str = "data"
    ) -> Manifest:
        """data as a one-file bundle (file `name`) under fields' key."""
        with tempfile.TemporaryDirectory(prefix="kcache-") as d:
            path = os.path.join(d, name)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(data)
            return self.push_dir(d, fields)

    def pull_bytes(self, key: str, name: Optional[str] = None) -> bytes:
        """The verified bytes of one file (`name`, else the bundle's only
        file) of the bundle of key."""
        m = self.pull(key)
        if name is None:
            if len(m.files) != 1:
                raise InvalidArgument(
                    1,
                    "KC_EINVAL",
                    "bad_request",
                    "bundle %s has %d files: name one" % (key, len(m.files)),
                )
            name = m.files[0]["path"]
        return self.file_bytes(m, name)

    # ---- leases ----
    def lease_take(self, key: str, ttl_s: int = 300) -> Lease:
        """Asks for the build lease of key (one builder per fleet)."""
        state = c_int()
        retry = c_int()
        token = ctypes.create_string_buffer(_lib.LEASE_TOKEN_MAX)
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_client_lease_take(
                self._h(),
                key.encode(),
                ttl_s,
                byref(state),
                token,
                byref(retry),
                err,
            )
        return Lease(
            key, _LEASE_STATES[state.value], token.value.decode(), retry.value
        )

    def lease_release(
        self, lease_or_key: Union[Lease, str], token: Optional[str] = None
    ) -> None:
        """Gives a granted lease back."""
        if isinstance(lease_or_key, Lease):
            k, token = lease_or_key.key, lease_or_key.token
        else:
            k = lease_or_key
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_client_lease_release(
                self._h(), k.encode(), _lib.b(token or ""), err
            )

    # ---- other ----
    def stats(self) -> Dict[str, Any]:
        """GET /v1/stats, parsed."""
        p = c_void_p()
        err = _lib.errbuf()
        with self._lock:
            _lib.lib.kc_client_stats(self._h(), byref(p), err)
        return json.loads(_lib.take_string(p))

    def warm(
        self,
        manifest: Union[PathLike, Mapping[str, Any]],
        out: Optional[PathLike] = None,
        deadline: Optional[float] = None,
        archs: Optional[Sequence[str]] = None,
        no_build: bool = False,
        no_upload: bool = False,
        device_arch: Optional[str] = None,
        check_ready: bool = False,
    ) -> Dict[str, Any]:
        """Fetch-or-build every key of a warmup manifest (kc_warm): a path,
        or the manifest as a mapping. Returns the per-key report (as
        `kcache warm --json` prints it) with "error" (null, or {"name",
        "message"}) added: a key not ready is in the report, not raised,
        unless check_ready. deadline: seconds for the whole warmup.
        kc_warm forks for builds: call it at start-up, before threads."""
        err = _lib.errbuf()
        w = c_void_p()
        if isinstance(manifest, Mapping):
            text = json.dumps(dict(manifest)).encode()
            _lib.lib.kc_warmup_parse(text, len(text), None, byref(w), err)
        else:
            _lib.lib.kc_warmup_load(os.fsencode(manifest), byref(w), err)
        try:
            o = _lib.WarmOpts()
            keep = []
            if archs:
                arr = (c_char_p * len(archs))(*[a.encode() for a in archs])
                keep.append(arr)
                o.archs = ctypes.cast(arr, ctypes.POINTER(c_char_p))
                o.n_archs = len(archs)
            o.no_build = int(no_build)
            o.no_upload = int(no_upload)
            o.deadline_s = float(deadline) if deadline else 0.0
            o.out_dir = None if out is None else os.fsencode(out)
            o.device_arch = _lib.b(device_arch)
            rep = _lib.WarmReport()
            with self._lock:
                rc = _lib.lib.kc_warm(
                    self._h(), w.value, byref(o), byref(rep), err
                )
            try:
                p = c_void_p()
                jerr = _lib.errbuf()
                _lib.lib.kc_warm_report_json(byref(rep), byref(p), jerr)
                report = json.loads(_lib.take_string(p))
            finally:
                _lib.lib.kc_warm_report_free(byref(rep))
        finally:
            _lib.lib.kc_warmup_free(w.value)
        if rc != 0:
            e = make_error(rc, err.value.decode("utf-8", "replace"))
            report["error"] = {"name": e.name, "message": e.message}
            if check_ready:
                raise e
        else:
            report["error"] = None
        return report


__all__ = [
    "Client",
    "Manifest",
    "Lease",
    "Error",
    "key",
    "canonical_key_json",
    "sha256_hex",
    "model_hash",
    "arch_valid",
]
