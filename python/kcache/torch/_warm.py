"""kcache.torch._warm: kcache.torch.warm(), the one call for a service.

    with kcache.torch.warm(model, name="my-service"):
        compiled = torch.compile(model)
        for x in warmup_inputs: compiled(x)

On enter: TORCHINDUCTOR_CACHE_DIR is filled with the model's entries from
kcached (per-entry bundles, kcache.torch.entries: FX graphs, AOTAutograd
entries and the compiled kernels, the CPU's .so files included), within
the deadline; Inductor's precompiled header is turned off (it is built
outside the cache directory, in $TMPDIR, before a kernel's .so is looked
for, so a fresh machine would run g++ for it; the setting is part of the
FX graph key, so CI and services that both go through warm() agree); on a
GPU, kcache.triton serves Triton's kernels and, with KCACHE_RESP_URL,
Inductor's remote caches are on. On exit: the entries kcached lacks are
uploaded, each under its lease, and the model is named (a write token).

Never raises into the service: kcached down, a refused token, a bundle
that fails verification all end in a normal compile, counted in `stats`.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any, Dict, Optional

from ..client import Client
from ._session import _Session

log = logging.getLogger("kcache.torch")
_warned_no_server = False


def _is_gpu(device: Optional[str]) -> bool:
    import torch

    if device is None:
        return bool(torch.cuda.is_available())
    return torch.device(device).type == "cuda"


def _no_precompiled_header() -> None:
    os.environ["TORCHINDUCTOR_CPP_CACHE_PRECOMPILE_HEADERS"] = "0"
    import torch._inductor.config as iconfig

    iconfig.cpp_cache_precompile_headers = False


def _gpu_paths(stats: Dict[str, Any]) -> None:
    """kcache.triton for Triton's kernels (cubins), and Inductor's remote
    caches where kcached's RESP front end is given."""
    if not os.environ.get("TRITON_CACHE_MANAGER"):
        # Triton reads it on each compile (3.4+ knobs: from the environment
        # unless set in code, which is then the user's choice)
        os.environ["TRITON_CACHE_MANAGER"] = "kcache.triton:CacheManager"
    stats["triton"] = os.environ["TRITON_CACHE_MANAGER"]
    if os.environ.get("KCACHE_RESP_URL"):
        from . import use_remote_caches

        use_remote_caches()
        stats["remote_caches"] = True


class Warm(_Session):
    """The context of warm(). `stats`: fetched (entries pulled), present
    (already local), uploaded, refused (bundles that failed verification),
    hits and misses (torch's FX graph and AOTAutograd cache, during the
    body), fetch_s, upload_s, skipped (reasons, e.g. "no server").
    gpu_paths=False leaves out the GPU's choices (CacheDirBundle)."""

    def __init__(
        self,
        model: Any,
        name: Optional[str] = None,
        *,
        client: Optional[Client] = None,
        gpu_paths: bool = True,
        **kw: Any,
    ):
        super().__init__(model, client, **kw)
        self.name = name
        self.gpu_paths = gpu_paths
        self._entries: Any = None
        self._fetch_done = False

    def _new_stats(self) -> Dict[str, Any]:
        return {
            "fetched": 0,
            "present": 0,
            "uploaded": 0,
            "refused": 0,
            "hits": 0,
            "misses": 0,
            "skipped": [],
        }

    def _skip(self, why: str) -> None:
        self.stats["skipped"].append(why)

    def _failed(self, saving: bool, e: Exception) -> None:
        self._skip("%s: %s" % ("upload" if saving else "fetch", e))
        log.warning("kcache.torch.warm: %s%s", "upload: " if saving else "", e)

    # ---- enter ----
    def _load(self) -> None:
        t0 = time.monotonic()
        try:
            self._open(t0)
        finally:
            self.stats["fetch_s"] = round(time.monotonic() - t0, 4)
            self._mark()

    def _open(self, t0: float) -> None:
        global _warned_no_server
        from . import inductor_cache_dir
        from .entries import Entries

        if not self.options.get("precompiled_header"):
            _no_precompiled_header()
        if self.gpu_paths and _is_gpu(self.device):
            _gpu_paths(self.stats)
        c = self._client()
        if c is None:
            self._skip("no server")
            if not _warned_no_server:
                log.warning(
                    "kcache.torch.warm: no server (KCACHE_URL "
                    "unset): compiling locally"
                )
                _warned_no_server = True
            return
        self._entries = Entries(
            c,
            self.model,
            inductor_cache_dir(),
            self.device,
            self.options,
            self.name,
            self.lease_ttl,
        )
        self._fetch(self.deadline - (time.monotonic() - t0))

    def _fetch(self, left: float) -> None:
        ent = self._entries
        done, res = self._within(ent.fetch, left)
        if not done:
            ent.cancel.set()  # stops between entries; no upload after
            self._skip("fetch: deadline")
        elif isinstance(res, BaseException):
            self._skip("fetch: %s" % getattr(res, "name", res))
        else:
            self._fetch_done = True
        for k in ("fetched", "present", "refused", "listed"):
            self.stats[k] = ent.stats[k]

    # ---- exit ----
    def _save(self) -> None:
        d = self._since(
            "fxgraph_cache_hit",
            "autograd_cache_hit",
            "fxgraph_cache_miss",
            "autograd_cache_miss",
        )
        self.stats["hits"] = d["fxgraph_cache_hit"] + d["autograd_cache_hit"]
        self.stats["misses"] = (
            d["fxgraph_cache_miss"] + d["autograd_cache_miss"]
        )
        if self._entries is None or not self._fetch_done:
            return
        if not self.upload_enabled:
            self._skip("upload: disabled")
            return
        self._upload()

    def _upload(self) -> None:
        ent = self._entries
        t0 = time.monotonic()

        def run() -> None:
            ent.upload()
            if ent.stats["uploaded"]:
                ent.name_model()

        done, res = self._within(run)
        if not done:
            self._skip("upload: in background (deadline)")
        elif isinstance(res, BaseException):
            self._skip("upload: %s" % getattr(res, "name", res))
        self.stats["upload_s"] = round(time.monotonic() - t0, 4)
        for k in (
            "uploaded",
            "taken",
            "failed",
            "uploaded_bytes",
            "name",
            "upload",
        ):
            if k in ent.stats:
                self.stats[k] = ent.stats[k]
        if str(ent.stats.get("upload", "")).startswith("skipped"):
            self._skip("upload: %s" % ent.stats["upload"][9:])


def warm(model: Any, name: Optional[str] = None, **kw: Any) -> Warm:
    """`with warm(model, name="svc"): compiled = torch.compile(model); ...`
    (module docstring). The keywords are Warm's: client, or url/token
    (default KCACHE_URL/KCACHE_TOKEN); device; deadline bounds the fetch
    and the wait for the upload (seconds, default 10); options: whatever
    else changes the compile (mode, dynamic...), in the keys;
    options={"precompiled_header": True} keeps Inductor's header;
    upload=False never writes."""
    return Warm(model, name, **kw)


class CacheDirBundle(Warm):
    """TORCHINDUCTOR_CACHE_DIR as per-entry bundles (kcache.torch.entries):
    populate() fills it from kcached before the first compile (the model's
    entries of this toolchain, listed in one request, each verified);
    push_added() uploads the entries kcached lacks, each under its lease.
    warm() is this plus the per-device choices; `stats` as Warm's.
    Triton's directory is kcache.triton's (TRITON_CACHE_MANAGER)."""

    def __init__(
        self,
        model: Any,
        client: Optional[Client] = None,
        *,
        name: Optional[str] = None,
        **kw: Any,
    ):
        super().__init__(model, name, client=client, gpu_paths=False, **kw)

    populate = _Session.load
    push_added = _Session.save


def cache_dir_bundle(
    model: Any, client: Optional[Client] = None, **kw: Any
) -> CacheDirBundle:
    """`with cache_dir_bundle(model=m): warm_up()`: the cache directory
    filled before, the entries kcached lacks pushed after. The keywords
    are CacheDirBundle's (Warm's, without gpu_paths)."""
    return CacheDirBundle(model, client, **kw)
