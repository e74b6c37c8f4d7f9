"""kcache.torch.mega: torch's Mega-Cache (the artifacts of
torch.compiler.save_cache_artifacts) as layered bundles: bucket
{"layer": n}, at most MAX_LAYERS; readers load every layer in order; a
process that compiled something new uploads the next layer under a lease.

    with kcache.torch.mega_cache(model=m) as mc:
        out = compiled(x)
"""

from __future__ import annotations

import functools
import logging
import time
from typing import Any, Callable, Dict, List, Mapping, Optional

from ..client import Client, Manifest
from ..errors import Error, Forbidden, NotFound, Unauthorized
from ._session import _Session
from .keys import _torch, key_fields

log = logging.getLogger("kcache.torch")

MAX_LAYERS = 32  # looked up in one request; a model past this stops adding


class _Layers:
    """The layered bundles of one kind: lookup of every layer in one
    request, fetch of those found, and the upload of the next one under a
    lease. Holds no torch state."""

    def __init__(
        self,
        client: Client,
        kind: str,
        model: Any,
        device: Optional[str],
        options: Optional[Mapping[str, Any]],
        lease_ttl: int = 600,
    ):
        self.client = client
        self.kind = kind
        self.lease_ttl = lease_ttl
        self.fields = [
            key_fields(kind, model, n, device, options)
            for n in range(MAX_LAYERS)
        ]
        self.keys = [Client.key(f) for f in self.fields]
        self.present = 0  # layers 0..present-1 exist
        self.unknown: Optional[str] = None  # why the layers are not known

    def find(self) -> List[Manifest]:
        """The manifests of the contiguous layers from 0 that kcached holds
        (one lookup), each pulled (blobs fetched, verified)."""
        found = self.client.lookup(self.keys)
        out = []
        for k in self.keys:
            if found.get(k) is None:
                break
            out.append(self.client.pull(k))
        self.present = len(out)
        return out

    def upload(
        self, push: Callable[[Dict[str, Any]], Manifest], stats: Dict[str, Any]
    ) -> None:
        """push(fields) of the next layer, under its lease: "granted"
        uploads; "present"/"held" mean another process did or does."""
        n = self.present
        if self.unknown:
            stats["upload"] = "skipped: layers unknown (%s)" % self.unknown
            return
        if n >= MAX_LAYERS:
            stats["upload"] = "skipped: %d layers" % n
            return
        key = self.keys[n]
        try:
            lease = self.client.lease_take(key, self.lease_ttl)
        except (Forbidden, Unauthorized) as e:
            stats["upload"] = "skipped: %s" % e.name
            return
        if not lease.granted:
            stats["upload"] = "skipped: lease %s" % lease.state
            return
        try:
            m = push(self.fields[n])
            stats["upload"] = "uploaded"
            stats["uploaded_key"] = m.key
            stats["uploaded_bytes"] = m.bytes
        finally:
            try:
                self.client.lease_release(lease)
            except Error:
                pass


class MegaCache(_Session):
    """Mega-Cache bundles for one model: load() before compiling (every
    layer fetched within the deadline, each loaded with
    torch.compiler.load_cache_artifacts; a layer torch refuses is counted
    in bad_layers and skipped), save() after (when this process compiled
    something new: save_cache_artifacts, uploaded as the next layer under
    a lease). Itself a context manager (load on enter, save on exit).
    `stats`: load, loaded_layers, loaded_bytes, fetch_s, upload and, once
    uploaded, uploaded_key and uploaded_bytes."""

    def _new_stats(self) -> Dict[str, Any]:
        return {
            "loaded_layers": 0,
            "loaded_bytes": 0,
            "load": "not run",
            "upload": "not run",
        }

    def _failed(self, saving: bool, e: Exception) -> None:
        if saving:
            self.stats["upload"] = "failed: %s" % e
            log.warning("kcache.torch: Mega-Cache upload: %s", e)
        else:
            self.stats["load"] = "skipped: %s" % e
            log.warning("kcache.torch: Mega-Cache load: %s", e)

    @functools.cached_property
    def _layers(self) -> Optional[_Layers]:
        try:
            c = self._client()
            if c is None:
                return None
            return _Layers(
                c,
                "mega",
                self.model,
                self.device,
                self.options,
                self.lease_ttl,
            )
        except Exception as e:  # a bad URL, no torch device: compile cold
            self.stats["load"] = "skipped: %s" % e
            return None

    def _load(self) -> None:
        self._mark()
        layers = self._layers
        if layers is None:
            if self.stats["load"] == "not run":
                self.stats["load"] = "skipped: no server"
            return
        t0 = time.monotonic()

        def fetch() -> List[bytes]:
            return [
                layers.client.file_bytes(m, "artifacts.bin")
                for m in layers.find()
            ]

        done, res = self._within(fetch)
        self.stats["fetch_s"] = round(time.monotonic() - t0, 4)
        if not done:
            self.stats["load"] = "skipped: deadline"
            layers.unknown = "deadline"  # do not upload over what is there
            return
        if isinstance(res, BaseException):
            self.stats["load"] = "skipped: %s" % res
            if not isinstance(res, NotFound):
                layers.unknown = getattr(res, "name", None) or "failed"
            return
        self._load_artifacts(res)
        self._mark()

    def _load_artifacts(self, layers: List[bytes]) -> None:
        torch = _torch()
        loaded = 0
        for data in layers:
            try:
                info = torch.compiler.load_cache_artifacts(data)
            except Exception as e:  # corrupt or foreign: torch compiles
                log.warning("kcache.torch: a Mega-Cache layer failed: %s", e)
                info = None
            if info is None:
                self.stats.setdefault("bad_layers", 0)
                self.stats["bad_layers"] += 1
                continue
            loaded += 1
            self.stats["loaded_bytes"] += len(data)
        self.stats["loaded_layers"] = loaded
        self.stats["load"] = "loaded" if loaded else "miss"

    def _save(self) -> None:
        layers = self._layers
        if layers is None or not self.upload_enabled:
            self.stats["upload"] = "skipped: disabled"
            return
        # an FX graph or AOTAutograd miss since load: torch compiled anew
        new = self._since("fxgraph_cache_miss", "autograd_cache_miss")
        if not any(n > 0 for n in new.values()):
            self.stats["upload"] = "skipped: nothing new"
            return
        saved = _torch().compiler.save_cache_artifacts()
        if not saved:
            self.stats["upload"] = "skipped: no artifacts"
            return
        data = saved[0]
        _upload_bounded(
            lambda: layers.upload(
                lambda f: layers.client.push_bytes(
                    data, f, name="artifacts.bin"
                ),
                self.stats,
            ),
            self,
        )


def _upload_bounded(fn: Callable[[], None], session: MegaCache) -> None:
    """An upload, waited for at most the deadline: past it the service
    goes on and the upload finishes on its thread (a process that exits
    first leaves its lease to lapse; the next process uploads)."""
    done, res = session._within(fn)
    if not done:
        session.stats["upload"] = "in background: deadline"
    elif isinstance(res, BaseException):
        session.stats["upload"] = "failed: %s" % res


def mega_cache(
    model: Any, client: Optional[Client] = None, **kw: Any
) -> MegaCache:
    """`with mega_cache(model=m): out = compiled(x)`: loads the model's
    Mega-Cache bundles on enter, uploads what this process compiled on exit
    (also when the body raised). The keywords are MegaCache's (url/token
    default to KCACHE_URL and KCACHE_TOKEN; deadline bounds the fetch, in
    seconds)."""
    return MegaCache(model, client, **kw)
