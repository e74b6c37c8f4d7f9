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
- Mega-Cache (kcache.torch.mega): `with mega_cache(model=...)`: the
  artifacts of `torch.compiler.save_cache_artifacts`, as layers (bucket
  {"layer": n}, at most MAX_LAYERS; readers load every layer in order):
  fetched and loaded on enter; on exit, when this process compiled
  something new, saved and uploaded as the next layer under a lease.
- Cache-dir bundles: `with cache_dir_bundle(model=...)`: warm()'s
  per-entry bundles without its per-device choices.

warm(), mega_cache() and cache_dir_bundle() return a session (Warm,
MegaCache, CacheDirBundle), itself the context manager, with the same
keywords: client or url/token (default KCACHE_URL/KCACHE_TOKEN), device,
options, deadline (seconds), upload, lease_ttl.

`prepopulate(fn, inputs_per_bucket, model=..., name=...)` is the CI form:
warm() around one call per shape bucket.

Nothing here raises into the service or blocks it past its deadline:
kcached down, a refused token, a corrupt or foreign bundle all end in a
normal compile; every outcome is counted in the object's `stats`.
"""

from __future__ import annotations

import logging
import os
from typing import (
    Any,
    Callable,
    Dict,
    Iterable,
    Mapping,
    Optional,
    Sequence,
    Union,
)

from ..client import Client, Manifest  # noqa: F401 (importable here before)
from ..errors import Error, Forbidden, NotFound, Unauthorized  # noqa: F401
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
from ._warm import CacheDirBundle, Warm, cache_dir_bundle, warm
from .mega import MAX_LAYERS, MegaCache, mega_cache

log = logging.getLogger("kcache.torch")


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


# ------------------------------------------------------------- cache dir


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
