"""kcache.torch.aot: compiled artifacts per shape bucket (AOTInductor).

For an exportable model (`torch.export` with `strict=False`, no graph
breaks: what `torch.compile(fullgraph=True)` accepts), each shape bucket is
compiled once, for the fleet, into an AOTInductor package (`.pt2`: the
generated C++ or Triton kernels and the wrapper, one shared object), kept in
kcached as one bundle per (model, bucket, device, toolchain). A service then
starts at the `import torch` floor: it fetches the bundles in one batch,
verifies them and loads each through torch's C++ loader
(`torch._C._aoti.AOTIModelPackageLoader`), without importing Dynamo or
Inductor; the model's own weights are handed to the loader, so a package
holds no weights (`aot_inductor.package_constants_in_so=False`) and is keyed
by the model's architecture, not its weights.

    compiled = kcache.torch.compile(model, name="svc", buckets=[(x1,), (x8,)])
    y = compiled(x)          # dispatched by input shape

A bucket is one example call. Its batch dimension (dim 0 of every tensor
whose dim 0 is the example's batch) is dynamic from the previous bucket's
batch + 1 (1 for the first) to its own; the other dimensions, dtypes and
devices are exact. A call outside every bucket, and every bucket with no
artifact for this device and toolchain, goes to `torch.compile` (under
`kcache.torch.warm` where that exists), compiled and warmed in `compile()`.

Keys: model = model_hash(model); build = SHA-256 of {"builder", "kind":
"aoti", the bucket's exact shapes and dtypes, the service's name, the
Inductor configs}; bucket = {"batch": hi, "batch_min": lo}; arch = the
GPU's SM or "sm_00"; toolchain = torch, accel, python ABI, triton (GPU
only: CPU packages hold C++), and cpu_isa: the vector ISA the package was
compiled for (Inductor's pick_vec_isa, e.g. "avx512+avx512_vnni"). The
service does not run Inductor's ISA probes (seconds): it lists the ISA
levels this CPU can run (torch.cpu's CPUID checks, capped by
ATEN_CPU_CAPABILITY as Inductor is), best first, looks all their keys up in
one request, and loads the best one present. A package for an ISA this CPU
lacks is never a candidate, and its own metadata is checked again before
its shared object is loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sysconfig
import tempfile
import time
import zipfile
from typing import (
    Any,
    Callable,
    Dict,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
)

from ..client import Client
from ..errors import Error, Forbidden, Unauthorized
from . import keys as _keys
from ._util import _bounded, _client

log = logging.getLogger("kcache.torch.aot")

KIND = "aoti"
BUILDER = "kcache-torch-aot/1"
FORMAT = "kcache-aoti/1"
PT2 = "model.pt2"
META = "meta.json"
EXTRA = "constants.pt"  # constants the exported graph made (not the module's)
INDUCTOR_CONFIGS = {"aot_inductor.package_constants_in_so": False}

# x86 vector ISA levels as Inductor names them (cpu_vec_isa: VecAMX,
# VecAVX512VNNI, VecAVX512, VecAVX2), best first, with the CPUID features
# each needs and the extra flags Inductor adds where the CPU has them.
_X86_LEVELS = [
    ("avx512+avx512_vnni+amx_tile", ("avx512", "vnni", "amx_tile")),
    ("avx512+avx512_vnni", ("avx512", "vnni")),
    ("avx512", ("avx512",)),
    ("avx2", ("avx2",)),
]
_CAPABILITY_CAP = {"default": 4, "avx2": 3, "avx512": 0}  # ATEN_CPU_CAPABILITY


# --------------------------------------------------------------- the ISA


def _cpu_features() -> Dict[str, bool]:
    """What this CPU can run, from torch.cpu's CPUID checks (no compiler)."""
    import torch

    c = torch.cpu
    f = {
        "avx2": c._is_avx2_supported(),
        "avx512": c._is_avx512_supported(),
        "vnni": c._is_vnni_supported(),
        "amx_tile": c._is_amx_tile_supported(),
        "avx512_bf16": c._is_avx512_bf16_supported(),
        "amx_fp16": c._is_amx_fp16_supported(),
    }
    return {k: bool(v) for k, v in f.items()}


def host_isa_labels() -> List[str]:
    """The ISA labels of packages this CPU can run, best first ("none": no
    vector ISA, always last). Cheap: no compiler probes. On a CPU other than
    x86_64 only "none" (packages built there are served only when Inductor
    picked no vector ISA)."""
    if platform.machine() not in ("x86_64", "AMD64"):
        return ["none"]
    f = _cpu_features()
    start = 0
    cap = os.environ.get("ATEN_CPU_CAPABILITY", "").lower()
    if cap in _CAPABILITY_CAP:
        start = _CAPABILITY_CAP[cap]
    out: List[str] = []
    for label, needs in _X86_LEVELS[start:]:
        if not all(f[n] for n in needs):
            continue
        extras = [""]
        if "avx512" in needs and f["avx512_bf16"]:
            extras = ["+avx512_bf16", ""]
            if "amx_tile" in needs and f["amx_fp16"]:
                extras = [
                    "+avx512_bf16+amx_fp16",
                    "+avx512_bf16",
                    "+amx_fp16",
                    "",
                ]
        out += [label + e for e in extras]
    return out + ["none"]


def build_isa_label() -> str:
    """The ISA Inductor compiles for in this process (its probes run here:
    a build is about to compile anyway), as a label: the words of
    str(pick_vec_isa()) joined by "+", plus the optional flags it added."""
    from torch._inductor import cpu_vec_isa

    isa = cpu_vec_isa.pick_vec_isa()
    words = str(isa).split()
    if not words:
        return "none"
    if getattr(isa, "_is_avx512_bf16_supported", False):
        words.append("avx512_bf16")
    if getattr(isa, "_is_amx_fp16_supported", False):
        words.append("amx_fp16")
    return "+".join(words)


def _runnable(aoti_isa: str, labels: Sequence[str]) -> bool:
    """Whether a package whose AOTI_CPU_ISA metadata is aoti_isa ("AVX512
    AVX512_VNNI", "" for none) runs here: its words within a runnable label."""
    words = set(aoti_isa.lower().split())
    return not words or any(words <= set(lb.split("+")) for lb in labels)


# ------------------------------------------------------------ buckets


class Bucket:
    """One shape bucket: the example call and the range of its batch
    dimension. batched: the indices of the args whose dim 0 is the batch."""

    def __init__(
        self,
        example: Tuple[Any, ...],
        lo: int,
        hi: int,
        batched: Tuple[int, ...],
    ):
        self.example = example
        self.lo, self.hi = lo, hi
        self.batched = batched
        self.sig = _signature(example, batched)

    def spec(self) -> Dict[str, Any]:
        return {
            "lo": self.lo,
            "hi": self.hi,
            "batched": list(self.batched),
            "sig": self.sig,
        }

    def matches(self, args: Tuple[Any, ...]) -> bool:
        if len(args) != len(self.example):
            return False
        n = None
        for i, (a, e) in enumerate(zip(args, self.example)):
            if (
                getattr(a, "dtype", None) != e.dtype
                or a.device != e.device
                or a.dim() != e.dim()
            ):
                return False
            if i in self.batched:
                if a.shape[1:] != e.shape[1:]:
                    return False
                if n is None:
                    n = a.shape[0]
                if a.shape[0] != n:
                    return False
            elif a.shape != e.shape:
                return False
        return n is None or self.lo <= n <= self.hi

    def __repr__(self) -> str:
        return "Bucket(batch %d..%d)" % (self.lo, self.hi)


def _signature(
    example: Tuple[Any, ...], batched: Tuple[int, ...]
) -> List[Any]:
    return [
        [
            ("B",) + tuple(t.shape[1:]) if i in batched else tuple(t.shape),
            str(t.dtype),
            t.device.type,
        ]
        for i, t in enumerate(example)
    ]


def make_buckets(
    examples: Sequence[Any], dynamic: bool = True
) -> List[Bucket]:
    """Buckets from example calls (a tuple of tensors, or one tensor, each).
    Examples with the same shapes but for the batch share one batch axis,
    cut at their batches: (prev + 1)..batch. dynamic=False: exact shapes."""
    import torch

    calls: List[Tuple[Any, ...]] = []
    for ex in examples:
        args = tuple(ex) if isinstance(ex, (tuple, list)) else (ex,)
        if not args or not all(isinstance(a, torch.Tensor) for a in args):
            raise ValueError(
                "kcache.torch.compile: a bucket is a tuple of tensors"
            )
        calls.append(args)
    groups: Dict[str, List[Tuple[int, Tuple[Any, ...], Tuple[int, ...]]]] = {}
    for args in calls:
        b = args[0].shape[0] if args[0].dim() else None
        batched = tuple(
            i
            for i, a in enumerate(args)
            if dynamic and b is not None and a.dim() and a.shape[0] == b
        )
        sig = json.dumps(_signature(args, batched))
        groups.setdefault(sig, []).append((b or 0, args, batched))
    out: List[Bucket] = []
    for items in groups.values():
        items.sort(key=lambda t: t[0])
        prev = 0
        for b, args, batched in items:
            if b == prev:
                continue  # the same bucket twice
            lo = prev + 1 if batched else b
            out.append(Bucket(args, lo, b, batched))
            prev = b
    return out


# --------------------------------------------------------------- keys


def _tools(device: str, isa: str) -> Dict[str, str]:
    t = {
        "torch": _keys.torch_version(),
        "accel": _keys.accel(device),
        "cpu_isa": isa,
        "python": sysconfig.get_config_var("SOABI") or "unknown",
    }
    if device.startswith("cuda"):
        try:
            from importlib.metadata import version

            t["triton"] = version("triton")
        except Exception:
            pass
    return t


def bucket_fields(
    model_h: str, bucket: Bucket, device: str, isa: str, name: Optional[str]
) -> Dict[str, Any]:
    """The key fields of one bucket's package compiled for isa."""
    arch, extra = _keys.device_arch(device)
    tools = _tools(device, isa)
    tools.update(extra)
    build = json.dumps(
        {
            "builder": BUILDER,
            "kind": KIND,
            "name": name or "",
            "sig": bucket.sig,
            "batched": list(bucket.batched),
            "configs": INDUCTOR_CONFIGS,
        },
        sort_keys=True,
    )
    return {
        "model": model_h,
        "build": hashlib.sha256(build.encode()).hexdigest(),
        "arch": arch,
        "bucket": {"batch": bucket.hi, "batch_min": bucket.lo},
        "toolchain": tools,
    }


def _device_of(bucket: Bucket, device: Optional[str]) -> str:
    if device:
        return device
    d = bucket.example[0].device
    return (
        "cuda:%d" % d.index
        if d.type == "cuda" and d.index is not None
        else d.type
    )


# -------------------------------------------------------------- build


def _constants(model: Any) -> Dict[str, Any]:
    """The module's parameters and buffers by every name (tied weights and
    non-persistent buffers included): what a package without constants
    needs, by fully qualified name."""
    out: Dict[str, Any] = {}
    for kind in ("named_parameters", "named_buffers"):
        fn = getattr(model, kind, None)
        if fn is None:
            continue
        for n, t in fn(remove_duplicate=False):
            out[n] = t.detach()
    return out


def build_package(
    model: Any, bucket: Bucket, directory: str
) -> Dict[str, Any]:
    """torch.export of model on the bucket (batch Dim lo..hi), then
    aoti_compile_and_package without weights, into directory (model.pt2,
    constants.pt when the graph made constants of its own). Returns the meta
    (isa, AOTI metadata, constant names and shapes)."""
    import torch

    ex = bucket.example
    dyn: Any = None
    if bucket.batched and bucket.hi > bucket.lo:
        dim = torch.export.Dim("batch", min=bucket.lo, max=bucket.hi)
        dyn = tuple(
            {0: dim} if i in bucket.batched else None for i in range(len(ex))
        )
    ep = torch.export.export(model, ex, dynamic_shapes=dyn, strict=False)
    pt2 = os.path.join(directory, PT2)
    torch._inductor.aoti_compile_and_package(
        ep, package_path=pt2, inductor_configs=dict(INDUCTOR_CONFIGS)
    )
    loader = torch._C._aoti.AOTIModelPackageLoader(
        pt2, "model", False, 1, _device_index(ex[0])
    )
    fqns = list(loader.get_constant_fqns())
    own = _constants(model)
    extra = {}
    graph = dict(ep.state_dict)
    graph.update(getattr(ep, "constants", {}) or {})
    for n in fqns:
        if n not in own:
            t = graph.get(n)
            if not isinstance(t, torch.Tensor):
                raise ValueError("constant %s is not the model's" % n)
            extra[n] = t.detach().cpu().clone()
    if extra:
        torch.save(extra, os.path.join(directory, EXTRA))
    shapes = {
        n: [
            list((own.get(n) if n in own else extra[n]).shape),
            str((own.get(n) if n in own else extra[n]).dtype),
        ]
        for n in fqns
    }
    with open(pt2, "rb") as f:
        sha = hashlib.sha256(f.read()).hexdigest()
    return {
        "format": FORMAT,
        "isa": build_isa_label(),
        "aoti": dict(loader.get_metadata()),
        "constants": shapes,
        "pt2_sha256": sha,
        "bucket": bucket.spec(),
        "torch": str(torch.__version__),
    }


def _device_index(t: Any) -> int:
    return (
        t.device.index
        if t.device.type == "cuda" and t.device.index is not None
        else -1
    )


def _push_built(
    client: Client,
    model: Any,
    model_h: str,
    bucket: Bucket,
    device: str,
    name: Optional[str],
    fields_for: Callable[[str], Dict[str, Any]],
    stats: Dict[str, Any],
) -> Tuple[str, Dict[str, Any]]:
    """Builds one bucket's package and pushes it under the key of the ISA
    it was compiled for. Returns (key, fields)."""
    with tempfile.TemporaryDirectory(prefix="kcache-aoti-") as d:
        t0 = time.monotonic()
        meta = build_package(model, bucket, d)
        fields = fields_for(meta["isa"])
        meta["fields"] = fields
        with open(os.path.join(d, META), "w") as f:
            json.dump(meta, f, sort_keys=True)
        m = client.push_dir(d, fields)
        stats["build_s"] = stats.get("build_s", 0) + round(
            time.monotonic() - t0, 2
        )
        stats["uploaded_bytes"] = stats.get("uploaded_bytes", 0) + m.bytes
        return m.key, fields


# ------------------------------------------------------------ loading


class Refused(Exception):
    """An artifact that is not what its key says (foreign, corrupt, for
    another CPU or model): never loaded."""


def _aoti_meta(pt2: str) -> Dict[str, str]:
    """The package's own metadata (wrapper_metadata.json), read from the zip
    without loading its shared object."""
    with zipfile.ZipFile(pt2) as z:
        names = [
            n for n in z.namelist() if n.endswith("wrapper_metadata.json")
        ]
        if len(names) != 1:
            raise Refused("not one AOTInductor model in the package")
        return json.loads(z.read(names[0]))


class _Runner:
    """One loaded package: the C++ loader, the model's weights handed to it
    (kept referenced here: the loader holds their pointers), and the output
    tree spec."""

    def __init__(
        self,
        directory: str,
        model: Any,
        fields: Dict[str, Any],
        device: str,
        labels: Sequence[str],
    ):
        import torch
        import torch.utils._pytree as pytree

        pt2 = os.path.join(directory, PT2)
        try:
            with open(os.path.join(directory, META)) as f:
                meta = json.load(f)
        except (OSError, ValueError) as e:
            raise Refused("meta.json: %s" % e)
        if meta.get("format") != FORMAT or meta.get("fields") != fields:
            raise Refused("foreign artifact: its fields are not this key's")
        with open(pt2, "rb") as f:
            if hashlib.sha256(f.read()).hexdigest() != meta.get("pt2_sha256"):
                raise Refused("model.pt2 does not match its hash")
        try:
            am = _aoti_meta(pt2)
        except (zipfile.BadZipFile, KeyError, ValueError) as e:
            raise Refused("not a package: %s" % e)
        dev = torch.device(device)
        if am.get("AOTI_DEVICE_KEY") != dev.type:
            raise Refused("built for device %s" % am.get("AOTI_DEVICE_KEY"))
        if not _runnable(am.get("AOTI_CPU_ISA", ""), labels):
            raise Refused("built for ISA %s" % am.get("AOTI_CPU_ISA"))
        consts = _constants(model)
        if os.path.exists(os.path.join(directory, EXTRA)):
            consts.update(
                torch.load(os.path.join(directory, EXTRA), weights_only=True)
            )
        want = meta.get("constants") or {}
        for n, (shape, dtype) in want.items():
            t = consts.get(n)
            if t is None or list(t.shape) != shape or str(t.dtype) != dtype:
                raise Refused("constant %s differs from the model's" % n)
        idx = dev.index if dev.type == "cuda" and dev.index is not None else -1
        if os.environ.get("KCACHE_AOT_LOADER") == "python":
            # torch's Python loader (imports torch._inductor): for comparison
            from torch._inductor import aoti_load_package

            self.loader = aoti_load_package(pt2, device_index=idx).loader
        else:
            self.loader = torch._C._aoti.AOTIModelPackageLoader(
                pt2, "model", False, 1, idx
            )
        if sorted(self.loader.get_constant_fqns()) != sorted(want):
            raise Refused("the package's constants are not its meta's")
        self._consts = {n: consts[n].to(dev).contiguous() for n in want}
        self.loader.load_constants(self._consts, False, True, True)
        self.out_spec = pytree.treespec_loads(self.loader.get_call_spec()[1])
        self._unflatten = pytree.tree_unflatten

    def __call__(self, *args: Any) -> Any:
        # the package was compiled for the example's (contiguous) strides
        return self._unflatten(
            self.loader.boxed_run([a.contiguous() for a in args]),
            self.out_spec,
        )


# ----------------------------------------------------------- the model


class AotModel:
    """The callable kcache.torch.compile returns: each call goes to the
    first bucket whose shapes it fits and that has a loaded package, else
    to the fallback (torch.compile'd model, or the model itself).
    `stats`: per bucket "loaded", "built" or "fallback" (with the key, the
    ISA, a refusal's or a skipped build's reason), and the counts."""

    def __init__(self, model: Any, buckets: List[Bucket]):
        self.model = model
        self.buckets = buckets
        self.runners: Dict[int, _Runner] = {}
        self.fallback: Callable[..., Any] = model
        self.stats: Dict[str, Any] = {
            "buckets": {},
            "loaded": 0,
            "built": 0,
            "fallback": 0,
        }

    def __call__(self, *args: Any) -> Any:
        for i, b in enumerate(self.buckets):
            r = self.runners.get(i)
            if r is not None and b.matches(args):
                return r(*args)
        return self.fallback(*args)


class _Plan:
    """The candidate keys of every bucket (one per runnable ISA label, best
    first) and what kcached holds of them."""

    def __init__(
        self,
        model_h: str,
        buckets: List[Bucket],
        device: Optional[str],
        name: Optional[str],
    ):
        self.labels = host_isa_labels()
        self.devices = [_device_of(b, device) for b in buckets]
        self.cands: List[List[Tuple[str, Dict[str, Any]]]] = []
        for b, dev in zip(buckets, self.devices):
            row = []
            for isa in self.labels:  # a GPU package's wrapper is host code too
                f = bucket_fields(model_h, b, dev, isa, name)
                row.append((Client.key(f), f))
            self.cands.append(row)

    def keys(self) -> List[str]:
        return [k for row in self.cands for k, _ in row]


def _fetch(
    client: Client,
    plan: _Plan,
    root: str,
    only: Optional[Sequence[int]] = None,
) -> Dict[int, Tuple[str, Dict[str, Any], str]]:
    """One lookup of every candidate key, then each bucket's best present
    bundle pulled (blobs fetched in one batch, verified) and written under
    root/<key>. Returns {bucket: (key, fields, directory)}."""
    idx = range(len(plan.cands)) if only is None else only
    found = client.lookup([k for i in idx for k, _ in plan.cands[i]])
    out = {}
    for i in idx:
        for k, f in plan.cands[i]:
            if found.get(k) is not None:
                d = os.path.join(root, k)
                client.pull_dir(k, d)
                out[i] = (k, f, d)
                break
    return out


def _artifact_root(client: Optional[Client]) -> str:
    base = client.cache_dir if client is not None else tempfile.gettempdir()
    d = os.path.join(base, "aoti")
    os.makedirs(d, exist_ok=True)
    return d


def compile(
    model: Any,
    name: Optional[str] = None,
    buckets: Sequence[Any] = (),
    *,
    client: Optional[Client] = None,
    url: Optional[str] = None,
    token: Optional[str] = None,
    device: Optional[str] = None,
    deadline: float = 10.0,
    build: bool = True,
    build_wait: Optional[float] = None,
    fallback: str = "compile",
    dynamic: bool = True,
    compile_kwargs: Optional[Mapping[str, Any]] = None,
    model_key: Optional[str] = None,
) -> AotModel:
    """The one call for an exportable model: for each bucket, the artifact
    for this device and toolchain, fetched and loaded (no compile stack
    imported when every bucket has one); a bucket without one is built here
    when build and this process gets the bucket's lease (one builder per
    fleet; the package is then uploaded and served), waited for up to
    build_wait seconds (default: deadline) when another replica holds the
    lease, else compiled by torch.compile (fallback "compile", under
    kcache.torch.warm when present, each such bucket's example run once
    here) or run eagerly (fallback "eager"). Never raises into the service
    for kcached's sake: kcached down, a refused token, a corrupt, foreign or
    mismatched artifact all end in the fallback, counted in `.stats`.
    model_key: the model's hash when the caller has one (else
    keys.model_hash(model))."""
    t0 = time.monotonic()
    bs = make_buckets(buckets, dynamic)
    am = AotModel(model, bs)
    st = am.stats
    for i, b in enumerate(bs):
        st["buckets"][i] = {"range": [b.lo, b.hi], "state": "miss"}
    todo = list(range(len(bs)))
    c = None
    try:
        c = _client(client, url, token, deadline)
        if c is None:
            st["reason"] = "no server (KCACHE_URL unset)"
            log.warning(
                "kcache.torch.compile: no server (KCACHE_URL unset): compiling"
            )
        else:
            mh = model_key or _keys.model_hash(model)
            plan = _Plan(mh, bs, device, name)
            root = _artifact_root(c)
            done, res = _bounded(lambda: _fetch(c, plan, root), deadline)
            st["fetch_s"] = round(time.monotonic() - t0, 4)
            if not done:
                st["reason"] = "fetch: deadline"
            elif isinstance(res, BaseException):
                st["reason"] = "fetch: %s" % res
            else:
                todo = _load_found(am, res, plan, todo)
                if todo and build:
                    todo = _build_missing(
                        am,
                        c,
                        mh,
                        plan,
                        root,
                        todo,
                        name,
                        deadline if build_wait is None else build_wait,
                    )
    except Exception as e:  # never into the service
        st["reason"] = "%s: %s" % (type(e).__name__, e)
    _fall_back(am, todo, fallback, name, c, compile_kwargs, deadline)
    st["first_ready_s"] = round(time.monotonic() - t0, 4)
    return am


def _load_found(
    am: AotModel,
    found: Mapping[int, Tuple[str, Dict[str, Any], str]],
    plan: _Plan,
    todo: List[int],
) -> List[int]:
    left = []
    for i in todo:
        if i not in found:
            left.append(i)
            continue
        k, f, d = found[i]
        bst = am.stats["buckets"][i]
        try:
            am.runners[i] = _Runner(
                d, am.model, f, plan.devices[i], plan.labels
            )
            bst.update(state="loaded", key=k, isa=f["toolchain"]["cpu_isa"])
            am.stats["loaded"] += 1
        except Exception as e:  # refused or unloadable: the fallback
            bst.update(state="refused", key=k, reason=str(e)[:200])
            log.warning("kcache.torch.compile: artifact %s refused: %s", k, e)
            left.append(i)
    return left


def _build_missing(
    am: AotModel,
    c: Client,
    mh: str,
    plan: _Plan,
    root: str,
    todo: List[int],
    name: Optional[str],
    wait: float,
) -> List[int]:
    """Each missing bucket under its lease (the key of the best label this
    CPU runs: the ISA Inductor will pick here): granted, built, pushed and
    loaded; held by another replica, waited for within `wait`."""
    left, waiting = [], []
    for i in todo:
        bst = am.stats["buckets"][i]
        if bst["state"] == "refused":
            left.append(i)  # never build over a bad bundle: write-once
            continue
        lease_key = plan.cands[i][0][0]
        try:
            lease = c.lease_take(lease_key, 1800)
        except (Forbidden, Unauthorized) as e:
            bst["build"] = "skipped: %s" % e.name
            left.append(i)
            continue
        if lease.state == "present":
            waiting.append(i)
            continue
        if not lease.granted:
            bst["build"] = "lease held"
            waiting.append(i)
            continue
        try:
            dev = plan.devices[i]
            k, f = _push_built(
                c,
                am.model,
                mh,
                am.buckets[i],
                dev,
                name,
                lambda isa, b=am.buckets[i], d=dev: bucket_fields(
                    mh, b, d, isa, name
                ),
                bst,
            )
            d = os.path.join(root, k)
            c.pull_dir(k, d)
            am.runners[i] = _Runner(d, am.model, f, dev, plan.labels)
            bst.update(state="built", key=k, isa=f["toolchain"]["cpu_isa"])
            am.stats["built"] += 1
        except Exception as e:
            bst["build"] = "failed: %s" % str(e)[:200]
            log.warning(
                "kcache.torch.compile: build of %r: %s", am.buckets[i], e
            )
            left.append(i)
        finally:
            try:
                c.lease_release(lease)
            except Error:
                pass
    if waiting:
        left += _wait_for(am, c, plan, root, waiting, wait)
    return sorted(left)


def _wait_for(
    am: AotModel,
    c: Client,
    plan: _Plan,
    root: str,
    idx: List[int],
    wait: float,
) -> List[int]:
    """Polls for the buckets another replica builds, until wait runs out."""
    end = time.monotonic() + wait
    left = list(idx)
    while left:
        try:
            got = _fetch(c, plan, root, left)
        except Error:
            got = {}
        for i in list(got):
            am.stats["buckets"][i]["waited"] = True
        left = _load_found(am, got, plan, left) if got else left
        if not left or time.monotonic() >= end:
            break
        time.sleep(min(2.0, max(0.0, end - time.monotonic())))
    return left


def _fall_back(
    am: AotModel,
    todo: List[int],
    mode: str,
    name: Optional[str],
    c: Optional[Client],
    compile_kwargs: Optional[Mapping[str, Any]],
    deadline: float,
) -> None:
    """The buckets without a package, and every shape outside the buckets:
    torch.compile (mode "compile"; each missing bucket's example run once,
    under kcache.torch.warm when present) or the model itself ("eager").
    torch.compile is set up lazily when every bucket loaded, so the compile
    stack is imported only when a call needs it."""
    for i in todo:
        am.stats["buckets"][i]["state"] = "fallback"
        am.stats["fallback"] += 1
    if mode == "eager":
        am.fallback = am.model
        return
    state: Dict[str, Any] = {}
    kw = dict(compile_kwargs or {})

    def compiled(*args: Any) -> Any:
        fn = state.get("fn")
        if fn is None:
            import torch

            fn = state["fn"] = torch.compile(am.model, **kw)
        return fn(*args)

    am.fallback = compiled
    if not todo:
        return
    import kcache.torch as kt

    warm = getattr(kt, "warm", None)
    try:
        ctx = (
            warm(am.model, name, client=c, deadline=deadline)
            if warm is not None
            else None
        )
    except Exception as e:
        log.warning("kcache.torch.compile: warm: %s", e)
        ctx = None
    import torch

    with torch.no_grad():
        if ctx is None:
            for i in todo:
                compiled(*am.buckets[i].example)
        else:
            with ctx:
                for i in todo:
                    compiled(*am.buckets[i].example)


# ------------------------------------------------------------ publish


def publish(
    model: Any,
    buckets: Sequence[Any],
    name: Optional[str] = None,
    *,
    client: Optional[Client] = None,
    url: Optional[str] = None,
    token: Optional[str] = None,
    device: Optional[str] = None,
    dynamic: bool = True,
    model_key: Optional[str] = None,
    lease_ttl: int = 1800,
) -> Dict[str, Any]:
    """The CI form: builds and uploads the package of every bucket that
    kcached lacks for this machine's ISA (run it on the fleet's CPU model;
    ATEN_CPU_CAPABILITY=avx2 builds for an older level), each under its
    lease. Raises on errors (CI should see them). Returns per bucket:
    "present", "built" (with key, isa, build_s, bytes) or "lease held"."""
    import torch

    c = _client(client, url, token, 60.0)
    if c is None:
        raise ValueError("kcache.torch.aot.publish: no server (KCACHE_URL)")
    bs = make_buckets(buckets, dynamic)
    mh = model_key or _keys.model_hash(model)
    isa = build_isa_label()
    out: Dict[str, Any] = {"isa": isa, "buckets": []}
    with torch.no_grad():
        for b in bs:
            dev = _device_of(b, device)
            fields = bucket_fields(mh, b, dev, isa, name)
            k = Client.key(fields)
            r: Dict[str, Any] = {"range": [b.lo, b.hi], "key": k}
            out["buckets"].append(r)
            if c.lookup([k]).get(k) is not None:
                r["state"] = "present"
                continue
            lease = c.lease_take(k, lease_ttl)
            if not lease.granted:
                r["state"] = "lease %s" % lease.state
                continue
            try:
                k2, _ = _push_built(
                    c,
                    model,
                    mh,
                    b,
                    dev,
                    name,
                    lambda i, b=b, d=dev: bucket_fields(mh, b, d, i, name),
                    r,
                )
                if k2 != k:
                    raise RuntimeError("built for another ISA than %r" % isa)
                r["state"] = "built"
            finally:
                c.lease_release(lease)
    return out


__all__ = [
    "compile",
    "publish",
    "AotModel",
    "Bucket",
    "make_buckets",
    "host_isa_labels",
    "build_isa_label",
    "bucket_fields",
    "build_package",
    "Refused",
]
