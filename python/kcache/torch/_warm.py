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
import threading
import time
from typing import Any, Dict, Mapping, Optional

from ..client import Client

log = logging.getLogger("kcache.torch")
_warned_no_server = False


def _counts() -> Dict[str, int]:
    try:
        from torch._dynamo.utils import counters as c
    except Exception:
        return {}
    return {
        "fx_hit": int(c["inductor"].get("fxgraph_cache_hit", 0)),
        "fx_miss": int(c["inductor"].get("fxgraph_cache_miss", 0)),
        "aot_hit": int(c["aot_autograd"].get("autograd_cache_hit", 0)),
        "aot_miss": int(c["aot_autograd"].get("autograd_cache_miss", 0)),
    }


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


class Warm:
    """The context of warm(). `stats`: fetched (entries pulled), present
    (already local), uploaded, refused (bundles that failed verification),
    hits and misses (torch's FX graph and AOTAutograd cache, during the
    body), fetch_s, upload_s, skipped (reasons, e.g. "no server")."""

    def __init__(
        self,
        model: Any,
        name: Optional[str] = None,
        *,
        client: Optional[Client] = None,
        url: Optional[str] = None,
        token: Optional[str] = None,
        device: Optional[str] = None,
        deadline: float = 10.0,
        options: Optional[Mapping[str, Any]] = None,
        upload: bool = True,
        gpu_paths: bool = True,
    ):
        self.model = model
        self.gpu_paths = gpu_paths
        self.name = name
        self.device = device
        self.deadline = float(deadline)
        self.options = dict(options or {})
        self.upload_enabled = upload
        self.stats: Dict[str, Any] = {
            "fetched": 0,
            "present": 0,
            "uploaded": 0,
            "refused": 0,
            "hits": 0,
            "misses": 0,
            "skipped": [],
        }
        self._client_args = (client, url, token)
        self._entries: Any = None
        self._fetch_done = False
        self._before: Dict[str, int] = {}

    # ---- enter ----
    def _client(self) -> Optional[Client]:
        client, url, token = self._client_args
        if client is not None:
            return client
        url = url or os.environ.get("KCACHE_URL")
        if not url:
            return None
        t = max(1.0, self.deadline)
        return Client(
            url=url, token=token, timeout=t, connect_timeout=min(2.0, t)
        )

    def _skip(self, why: str) -> None:
        self.stats["skipped"].append(why)

    def __enter__(self) -> "Warm":
        global _warned_no_server
        t0 = time.monotonic()
        try:
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
            else:
                self._entries = Entries(
                    c,
                    self.model,
                    inductor_cache_dir(),
                    self.device,
                    self.options,
                    self.name,
                )
                self._fetch(self.deadline - (time.monotonic() - t0))
        except Exception as e:  # never into the service
            self._skip("fetch: %s" % e)
            log.warning("kcache.torch.warm: %s", e)
        self.stats["fetch_s"] = round(time.monotonic() - t0, 4)
        self._before = _counts()
        return self

    def _fetch(self, left: float) -> None:
        ent = self._entries
        box: Dict[str, Any] = {}

        def run() -> None:
            try:
                ent.fetch()
            except BaseException as e:
                box["e"] = e

        th = threading.Thread(target=run, name="kcache-warm", daemon=True)
        th.start()
        th.join(max(0.0, left))
        if th.is_alive():
            ent.cancel.set()  # stops between entries; no upload after
            self._skip("fetch: deadline")
        elif "e" in box:
            self._skip("fetch: %s" % getattr(box["e"], "name", box["e"]))
        else:
            self._fetch_done = True
        for k in ("fetched", "present", "refused"):
            self.stats[k] = ent.stats[k]
        self.stats["listed"] = ent.stats["listed"]

    # ---- exit ----
    def __exit__(self, *exc: Any) -> None:
        try:
            now = _counts()
            b = self._before
            self.stats["hits"] = sum(
                now.get(k, 0) - b.get(k, 0) for k in ("fx_hit", "aot_hit")
            )
            self.stats["misses"] = sum(
                now.get(k, 0) - b.get(k, 0) for k in ("fx_miss", "aot_miss")
            )
            if self._entries is None or not self._fetch_done:
                return
            if not self.upload_enabled:
                self._skip("upload: disabled")
                return
            self._upload()
        except Exception as e:
            self._skip("upload: %s" % e)
            log.warning("kcache.torch.warm: upload: %s", e)

    def _upload(self) -> None:
        ent = self._entries
        t0 = time.monotonic()

        def run() -> None:
            ent.upload()
            if ent.stats["uploaded"]:
                ent.name_model()

        th = threading.Thread(target=run, name="kcache-upload", daemon=True)
        th.start()
        th.join(self.deadline)
        if th.is_alive():
            self._skip("upload: in background (deadline)")
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


def warm(
    model: Any,
    name: Optional[str] = None,
    *,
    client: Optional[Client] = None,
    url: Optional[str] = None,
    token: Optional[str] = None,
    device: Optional[str] = None,
    deadline: float = 10.0,
    options: Optional[Mapping[str, Any]] = None,
    upload: bool = True,
) -> Warm:
    """`with warm(model, name="svc"): compiled = torch.compile(model); ...`
    (module docstring). url/token default to KCACHE_URL/KCACHE_TOKEN;
    deadline bounds the fetch and the wait for the upload (seconds);
    options: whatever else changes the compile (mode, dynamic...), in the
    keys; options={"precompiled_header": True} keeps Inductor's header."""
    return Warm(
        model,
        name,
        client=client,
        url=url,
        token=token,
        device=device,
        deadline=deadline,
        options=options,
        upload=upload,
    )
