"""kcache.torch: warm a torch.compile service from kcached.

The one call (docs/TORCH.md):

    with kcache.torch.warm(model, name="my-service"):
        compiled = torch.compile(model)
        for x in warmup_inputs: compiled(x)

fills TORCHINDUCTOR_CACHE_DIR with the model's entries (FX graphs,
AOTAutograd entries, compiled kernels with their .so: one write-once
bundle per entry, kcache.torch.entries) before the first compile, turns on
what pays on a GPU (kcache.triton, Inductor's remote caches), and uploads
on exit the entries kcached lacks. The building blocks stay:

- Inductor's remote caches (FX graph, AOTAutograd) over kcached's Redis
  front end: `use_remote_caches(resp_url, token)`, or the env lines of
  `remote_cache_env`. Torch keys and validates its own entries.
- Mega-Cache: `with mega_cache(model=...)`: the artifacts of
  `torch.compiler.save_cache_artifacts`, as layers (bucket {"layer": n},
  at most MAX_LAYERS; readers load every layer in order): fetched and
  loaded on enter; on exit, when this process compiled something new,
  saved and uploaded as the next layer under a lease.
- Cache-dir bundles: `with cache_dir_bundle(model=...)`: warm()'s
  per-entry bundles without its per-device choices.

`prepopulate(fn, inputs_per_bucket, model=..., name=...)` is the CI form:
warm() around one call per shape bucket.

Nothing here raises into the service or blocks it past its deadline:
kcached down, a refused token, a corrupt or foreign bundle all end in a
normal compile; every outcome is counted in the object's `stats`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from ..client import Client, Manifest
from ..errors import Error, Forbidden, NotFound, Unauthorized
from ._util import _bounded, _client  # noqa: F401
from .keys import (
    BUILDER,
    CPU_ARCH,
    _torch,
    accel,
    cpu_isa,
    device_arch,
    key_fields,
    model_hash,
    toolchain,
    torch_version,
)
from ._warm import Warm, warm

log = logging.getLogger("kcache.torch")

MAX_LAYERS = 32  # looked up in one request; a model past this stops adding
# Files an upload of a cache directory leaves out: locks and temporaries
# (written while compiling, meaningless elsewhere).


# ---------------------------------------------------- Inductor remote caches


def remote_cache_env(
    resp_url: str, token: Optional[str] = None, autotune: bool = False
) -> Dict[str, str]:
    """The environment lines that point Inductor's FX graph and AOTAutograd
    remote caches at kcached's Redis front end (--resp-listen).
    resp_url: "redis://host:port" (or "host:port"); token goes in as the
    password. Also usable as documentation: print the lines."""
    url = resp_url if "://" in resp_url else "redis://" + resp_url
    if token:
        scheme, rest = url.split("://", 1)
        rest = rest.split("@", 1)[-1]
        from urllib.parse import quote

        url = "%s://:%s@%s" % (scheme, quote(token, safe=""), rest)
    env = {
        "TORCHINDUCTOR_FX_GRAPH_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_AUTOGRAD_REMOTE_CACHE": "1",
        "TORCHINDUCTOR_REDIS_URL": url,
    }
    if autotune:
        env["TORCHINDUCTOR_AUTOTUNE_REMOTE_CACHE"] = "1"
    return env


def redact(url: str) -> str:
    """url with its password (a kcached token) replaced by "***": what
    the package returns or logs never carries a token."""
    if "://" not in url or "@" not in url.split("://", 1)[1].split("/", 1)[0]:
        return url
    scheme, rest = url.split("://", 1)
    creds, host = rest.split("@", 1)
    user = creds.split(":", 1)[0] if ":" in creds else ""
    return "%s://%s:***@%s" % (scheme, user, host)


def _redacted(env: Mapping[str, str]) -> Dict[str, str]:
    return {k: redact(v) if k.endswith("_URL") else v for k, v in env.items()}


def use_remote_caches(
    resp_url: Optional[str] = None,
    token: Optional[str] = None,
    autotune: bool = False,
) -> Dict[str, str]:
    """Turns Inductor's remote caches on for this process, against kcached's
    RESP listener: sets the environment (for subprocesses and a torch not
    yet imported) and, when torch is imported, its config. resp_url None:
    $KCACHE_RESP_URL; token None: $KCACHE_TOKEN. Returns the lines set,
    the token in the URL shown as "***".

    Torch handles its own failures: kcached down or a wrong token (redis-py
    >= 4.4: ConnectionError) turns the remote cache off for the process and
    compiles go on locally."""
    resp_url = resp_url or os.environ.get("KCACHE_RESP_URL")
    if not resp_url:
        raise ValueError("use_remote_caches: no RESP URL (KCACHE_RESP_URL)")
    if token is None:
        token = os.environ.get("KCACHE_TOKEN") or None
    env = remote_cache_env(resp_url, token, autotune)
    os.environ.update(env)
    import sys

    if "torch" in sys.modules:
        try:
            import torch._functorch.config as fconfig
            import torch._inductor.config as iconfig

            iconfig.fx_graph_remote_cache = True
            fconfig.enable_remote_autograd_cache = True
            if autotune:
                iconfig.autotune_remote_cache = True
        except Exception as e:  # a torch without these: env only
            log.warning("kcache.torch: remote caches: %s", e)
    return _redacted(env)


# --------------------------------------------------------------- counters


def counters() -> Dict[str, int]:
    """Torch's cache counters now: FX graph (inductor) and AOTAutograd hits,
    misses and bypasses, flattened ("fxgraph_cache_hit", ...)."""
    try:
        from torch._dynamo.utils import counters as c
    except Exception:
        return {}
    out: Dict[str, int] = {}
    for group in ("inductor", "aot_autograd"):
        for k, v in c[group].items():
            if "cache" in k:
                out[k] = int(v)
    return out


def _compiled_new(before: Mapping[str, int]) -> bool:
    now = counters()
    return any(
        now.get(k, 0) > before.get(k, 0)
        for k in ("fxgraph_cache_miss", "autograd_cache_miss")
    )


# ---------------------------------------------------------------- layers


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


def _upload_bounded(
    fn: Callable[[], None], deadline: float, stats: Dict[str, Any]
) -> None:
    """An upload, waited for at most deadline seconds: past it the service
    goes on and the upload finishes on its thread (a process that exits
    first leaves its lease to lapse; the next process uploads)."""
    done, res = _bounded(fn, deadline)
    if not done:
        stats["upload"] = "in background: deadline"
    elif isinstance(res, BaseException):
        stats["upload"] = "failed: %s" % res


# -------------------------------------------------------------- Mega-Cache


class MegaCache:
    """Mega-Cache bundles for one model: load() before compiling, save()
    after. `stats` says what happened (layers loaded, artifacts, upload)."""

    def __init__(
        self,
        model: Any,
        client: Optional[Client] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        device: Optional[str] = None,
        options: Optional[Mapping[str, Any]] = None,
        deadline: float = 10.0,
        upload: bool = True,
        lease_ttl: int = 600,
    ):
        self.deadline = deadline
        self.upload_enabled = upload
        self.stats: Dict[str, Any] = {
            "loaded_layers": 0,
            "loaded_bytes": 0,
            "load": "not run",
            "upload": "not run",
        }
        self._before: Dict[str, int] = {}
        self._layers: Optional[_Layers] = None
        try:
            c = _client(client, url, token, deadline)
            if c is not None:
                self._layers = _Layers(
                    c, "mega", model, device, options, lease_ttl
                )
        except Exception as e:  # a bad URL, no torch device: compile cold
            self.stats["load"] = "skipped: %s" % e

    def load(self) -> None:
        """Fetches every layer (within the deadline) and loads each with
        torch.compiler.load_cache_artifacts; a layer that fails is skipped."""
        self._before = counters()
        if self._layers is None:
            if self.stats["load"] == "not run":
                self.stats["load"] = "skipped: no server"
            return
        layers = self._layers
        t0 = time.monotonic()

        def fetch() -> List[bytes]:
            return [
                layers.client.file_bytes(m, "artifacts.bin")
                for m in layers.find()
            ]

        done, res = _bounded(fetch, self.deadline)
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
        torch = _torch()
        loaded = 0
        for data in res:
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
        self._before = counters()

    def save(self) -> None:
        """When this process compiled something new (an FX graph or
        AOTAutograd cache miss since load), save_cache_artifacts and upload
        as the next layer under a lease. Never raises."""
        if self._layers is None or not self.upload_enabled:
            self.stats["upload"] = "skipped: disabled"
            return
        if not _compiled_new(self._before):
            self.stats["upload"] = "skipped: nothing new"
            return
        try:
            torch = _torch()
            saved = torch.compiler.save_cache_artifacts()
            if not saved:
                self.stats["upload"] = "skipped: no artifacts"
                return
            data = saved[0]
            c = self._layers.client
            layers = self._layers
            _upload_bounded(
                lambda: layers.upload(
                    lambda f: c.push_bytes(data, f, name="artifacts.bin"),
                    self.stats,
                ),
                self.deadline,
                self.stats,
            )
        except Exception as e:
            self.stats["upload"] = "failed: %s" % e
            log.warning("kcache.torch: Mega-Cache upload: %s", e)


@contextlib.contextmanager
def mega_cache(
    model: Any,
    client: Optional[Client] = None,
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    device: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
    deadline: float = 10.0,
    upload: bool = True,
    lease_ttl: int = 600,
) -> Iterator[MegaCache]:
    """`with mega_cache(model=m): out = compiled(x)`: loads the model's
    Mega-Cache bundles on enter, uploads what this process compiled on exit
    (also when the body raised). url/token default to KCACHE_URL and
    KCACHE_TOKEN; deadline bounds the fetch (seconds)."""
    mc = MegaCache(
        model,
        client,
        url=url,
        token=token,
        device=device,
        options=options,
        deadline=deadline,
        upload=upload,
        lease_ttl=lease_ttl,
    )
    mc.load()
    try:
        yield mc
    finally:
        mc.save()


# -------------------------------------------------------- cache-dir bundles


def inductor_cache_dir() -> str:
    """TORCHINDUCTOR_CACHE_DIR, or torch's default (then set in the
    environment, so that torch and its workers use the same)."""
    d = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not d:
        try:
            from torch._inductor.runtime.cache_dir_utils import (
                default_cache_dir,
            )

            d = default_cache_dir()
        except Exception:
            import tempfile

            d = os.path.join(tempfile.gettempdir(), "torchinductor_kcache")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    return os.path.abspath(d)


class CacheDirBundle:
    """TORCHINDUCTOR_CACHE_DIR as per-entry bundles (kcache.torch.entries):
    populate() fills it from kcached before the first compile (the model's
    entries of this toolchain, listed in one request, each verified);
    push_added() uploads the entries kcached lacks, each under its lease.
    warm() is this plus the per-device choices; `stats` as Entries'.
    Triton's directory is kcache.triton's (TRITON_CACHE_MANAGER)."""

    def __init__(
        self,
        model: Any,
        client: Optional[Client] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        device: Optional[str] = None,
        options: Optional[Mapping[str, Any]] = None,
        deadline: float = 10.0,
        upload: bool = True,
        lease_ttl: int = 600,
        name: Optional[str] = None,
    ):
        from ._warm import Warm

        self._warm = Warm(
            model,
            name,
            client=client,
            url=url,
            token=token,
            device=device,
            deadline=deadline,
            options=options,
            upload=upload,
            gpu_paths=False,
        )
        self.stats = self._warm.stats

    def populate(self) -> None:
        self._warm.__enter__()

    def push_added(self) -> None:
        self._warm.__exit__(None, None, None)


@contextlib.contextmanager
def cache_dir_bundle(
    model: Any,
    client: Optional[Client] = None,
    *,
    url: Optional[str] = None,
    token: Optional[str] = None,
    device: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
    deadline: float = 10.0,
    upload: bool = True,
    lease_ttl: int = 600,
    name: Optional[str] = None,
) -> Iterator[CacheDirBundle]:
    """`with cache_dir_bundle(model=m): warm_up()`: the cache directory
    filled before, the entries kcached lacks pushed after."""
    cd = CacheDirBundle(
        model,
        client,
        url=url,
        token=token,
        device=device,
        options=options,
        deadline=deadline,
        upload=upload,
        lease_ttl=lease_ttl,
        name=name,
    )
    cd.populate()
    try:
        yield cd
    finally:
        cd.push_added()


# ------------------------------------------------------------ prepopulate


def prepopulate(
    fn: Callable[..., Any],
    inputs_per_bucket: Iterable[Union[Sequence[Any], Any]],
    *,
    model: Any,
    name: Optional[str] = None,
    client: Optional[Client] = None,
    url: Optional[str] = None,
    token: Optional[str] = None,
    resp_url: Optional[str] = None,
    device: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
    compile_kwargs: Optional[Mapping[str, Any]] = None,
    compile_fn: bool = True,
    mega: bool = False,
    deadline: float = 60.0,
) -> Dict[str, Any]:
    """CI prepopulation: the service's own form, warm(model, name), around
    one call per shape bucket (each element of inputs_per_bucket is the
    argument tuple of one call): the entries kcached lacks are uploaded and
    the model named. With resp_url Inductor's remote caches are written too
    (warm() turns them on by itself on a GPU, from KCACHE_RESP_URL); mega=True also uploads a Mega-Cache layer.

    fn: a torch.compile'd callable, or a function or module that is then
    compiled with compile_kwargs; compile_fn=False calls fn as it is (a
    function that calls the service's compiled modules). The service must
    compile the same way, with the same options and remote-cache setting
    (AOTAutograd's keys depend on it). Returns what happened."""
    torch = _torch()
    out: Dict[str, Any] = {"buckets": 0}
    if resp_url:
        out["remote_caches"] = use_remote_caches(resp_url, token)
    c = _client(client, url, token, deadline)
    w = warm(
        model,
        name,
        client=c,
        device=device,
        deadline=deadline,
        options=options,
    )
    mc = (
        MegaCache(model, c, device=device, options=options, deadline=deadline)
        if mega
        else None
    )
    with w:
        if mc is not None:
            mc.load()
        compiled = fn
        if (
            compile_fn
            and not hasattr(fn, "_torchdynamo_orig_callable")
            and not type(fn).__name__ == "OptimizedModule"
        ):
            compiled = torch.compile(fn, **dict(compile_kwargs or {}))
        for inputs in inputs_per_bucket:
            args = (
                tuple(inputs)
                if isinstance(inputs, (tuple, list))
                else (inputs,)
            )
            compiled(*args)
            out["buckets"] += 1
        if mc is not None:
            mc.save()
            out["mega"] = mc.stats
    out["warm"] = w.stats
    out["counters"] = counters()
    return out


__all__ = [
    "BUILDER",
    "CPU_ARCH",
    "torch_version",
    "use_remote_caches",
    "remote_cache_env",
    "redact",
    "mega_cache",
    "MegaCache",
    "cache_dir_bundle",
    "CacheDirBundle",
    "prepopulate",
    "key_fields",
    "model_hash",
    "device_arch",
    "accel",
    "cpu_isa",
    "counters",
    "inductor_cache_dir",
    "MAX_LAYERS",
    "warm",
    "Warm",
    "toolchain",
    "compile",
]
from .aot import compile  # noqa: E402,F401
