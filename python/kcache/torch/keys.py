"""kcache.torch.keys: the key fields of what kcache.torch stores: the
model's hash, the device's arch, and the toolchain (torch, triton, accel,
CPU ISA, Python ABI). A mismatch in any field is another key: a miss."""

from __future__ import annotations

import functools
import hashlib
import inspect
import json
import os
import sysconfig
import weakref
from typing import Any, Dict, Mapping, Optional, Tuple

BUILDER = "kcache-torch/1"
CPU_ARCH = "sm_00"

# ---------------------------------------------------------------- keys


def _torch():
    import torch  # imported on use: `import kcache` does not need torch

    return torch


def _triton_version() -> Optional[str]:
    try:
        import triton
    except Exception:
        return None
    return str(getattr(triton, "__version__", None) or "unknown")


def torch_version() -> str:
    """torch.__version__ as a string (the key's "torch")."""
    return str(_torch().__version__)


_ISA: Optional[str] = None


def _isa_candidates() -> list:
    """Inductor's vector ISAs this CPU's flags allow, best first, as
    valid_vec_isa_list() finds them but without its probe compiles (on x86
    it also dry-compiles each: seconds, and then only in the process that
    did it)."""
    import platform
    from torch._inductor import cpu_vec_isa as v

    if platform.machine() in ("x86_64", "AMD64"):
        flags = v.x86_isa_checker()
        return [
            isa
            for isa in v.supported_vec_isa_list
            if all(f in flags for f in str(isa).split())
        ]
    return list(v.valid_vec_isa_list())  # no probe compiles elsewhere


def cpu_isa() -> str:
    """The CPU vector ISA Inductor compiles C++ kernels for, worked out the
    same way in every process: pick_vec_isa()'s rule (ATEN_CPU_CAPABILITY,
    else the best; config.cpp.simdlen by bit width) over the ISAs the CPU's
    flags allow, without the probe compiles, so the answer does not depend
    on whether Inductor has probed yet. Memoized per process."""
    global _ISA
    if _ISA is not None:
        return _ISA
    torch = _torch()
    try:
        from torch._inductor import config as iconfig
        from torch._inductor import cpu_vec_isa as v

        cands = _isa_candidates()
        isa: Any = v.invalid_vec_isa
        if cands:
            if iconfig.cpp.simdlen is None:
                isa = v.get_isa_from_cpu_capability(
                    os.getenv("ATEN_CPU_CAPABILITY"), cands, v.invalid_vec_isa
                )
            else:
                isa = next(
                    (i for i in cands if i.bit_width() == iconfig.cpp.simdlen),
                    v.invalid_vec_isa,
                )
        _ISA = str(isa) or "none"
    except Exception:  # a torch without Inductor's CPU backend
        try:
            _ISA = str(torch.backends.cpu.get_cpu_capability()).lower()
        except Exception:
            _ISA = "unknown"
    return _ISA


def device_arch(device: Optional[str] = None) -> Tuple[str, Dict[str, str]]:
    """(arch, extra toolchain) of a device ("cuda", "cuda:1", "cpu"; None:
    cuda when available): "sm_90" for a GPU, "sm_00" on the CPU (whose ISA
    level is always in the toolchain as cpu_isa). A ROCm GPU is "sm_00"
    with its gfx name in the toolchain ("gfx": "gfx942")."""
    torch = _torch()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dev = torch.device(device)
    extra: Dict[str, str] = {}
    if dev.type == "cuda":
        idx = (
            dev.index if dev.index is not None else torch.cuda.current_device()
        )
        if torch.version.hip:
            props = torch.cuda.get_device_properties(idx)
            extra["gfx"] = str(getattr(props, "gcnArchName", "unknown"))[:128]
            return CPU_ARCH, extra
        major, minor = torch.cuda.get_device_capability(idx)
        return "sm_%d%d" % (major, minor), extra
    return CPU_ARCH, extra


def accel(device: Optional[str] = None) -> str:
    """ "cuda-<version>", "rocm-<version>" or "cpu": what the compiled code
    is for."""
    torch = _torch()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type != "cuda":
        return "cpu"
    if torch.version.hip:
        return "rocm-%s" % torch.version.hip
    return "cuda-%s" % torch.version.cuda


_MODEL_HASHES: "weakref.WeakKeyDictionary[Any, str]" = (
    weakref.WeakKeyDictionary()
)


@functools.lru_cache(maxsize=None)
def _class_source(cls: type) -> bytes:
    try:
        return inspect.getsource(cls).encode()
    except (OSError, TypeError):
        return cls.__qualname__.encode()


def _shape(t: Any) -> str:
    """A tensor's shape, or "lazy" for a lazy module's parameter before its
    first forward (UninitializedParameter has none yet)."""
    try:
        from torch.nn.parameter import UninitializedTensorMixin

        if isinstance(t, UninitializedTensorMixin):
            return "lazy"
    except Exception:
        pass
    return str(tuple(t.shape))


def model_hash(model: Any) -> str:
    """The model's identity for a key. A 64-hex string is taken as is; any
    other string is a name (hashed); an nn.Module is hashed from its class,
    the source of its classes (read once per class per process), its repr
    and every parameter's and buffer's name, shape and dtype (not the
    weights: compiled code does not depend on their values unless
    Inductor's freezing is on, then pass the weights' hash, e.g.
    kcache.model_hash(files)). A lazy module's parameters before its first
    forward hash as "lazy". Memoized per module object: the first answer
    holds for the object's life (a module hashed before its first forward
    keeps that hash after)."""
    if isinstance(model, str):
        if len(model) == 64 and all(c in "0123456789abcdef" for c in model):
            return model
        return hashlib.sha256(
            b"kcache-torch-model/1\0" + model.encode()
        ).hexdigest()
    try:
        got = _MODEL_HASHES.get(model)
    except TypeError:  # not weak-referenceable
        got = None
    if got is not None:
        return got
    h = hashlib.sha256(b"kcache-torch-module/1\0")
    h.update(
        type(model).__module__.encode()
        + b"."
        + type(model).__qualname__.encode()
        + b"\0"
    )
    seen = set()
    mods = model.modules() if hasattr(model, "modules") else [model]
    for m in mods:
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        h.update(_class_source(cls))
    h.update(repr(model).encode())
    for kind in ("named_parameters", "named_buffers"):
        for name, t in getattr(model, kind, lambda: [])():
            h.update(
                ("%s %s %s %s\n" % (kind, name, _shape(t), t.dtype)).encode()
            )
    out = h.hexdigest()
    try:
        _MODEL_HASHES[model] = out
    except TypeError:
        pass
    return out


def toolchain(device: Optional[str] = None) -> Dict[str, str]:
    """What changes compiled code besides the model: torch, triton (when
    importable), accel ("cuda-12.8", "rocm-6.3", "cpu"), cpu_isa (stable,
    cpu_isa()), python (the ABI, sysconfig SOABI), gfx on ROCm."""
    _, extra = device_arch(device)
    tools = {
        "torch": torch_version(),
        "accel": accel(device),
        "cpu_isa": cpu_isa(),
        "python": sysconfig.get_config_var("SOABI") or "unknown",
    }
    tv = _triton_version()
    if tv:
        tools["triton"] = tv
    tools.update(extra)
    return tools


def key_fields(
    kind: str,
    model: Any,
    layer: int = 0,
    device: Optional[str] = None,
    options: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    """The key fields of one bundle of `kind` ("mega", "inductor-dir",
    "triton-dir") for model on device, layer n. options: anything else that
    changes what is compiled (torch.compile's mode, dynamic, backend...)."""
    arch, _ = device_arch(device)
    tools = toolchain(device)
    build = json.dumps(
        {"builder": BUILDER, "kind": kind, "options": dict(options or {})},
        sort_keys=True,
        default=str,
    )
    return {
        "model": model_hash(model),
        "build": hashlib.sha256(build.encode()).hexdigest(),
        "arch": arch,
        "bucket": {"layer": int(layer)},
        "toolchain": tools,
    }
