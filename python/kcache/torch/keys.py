"""kcache.torch.keys: the key fields of what kcache.torch stores: the
model's hash, the device's arch, and the toolchain (torch, triton, accel,
CPU ISA, Python ABI). A mismatch in any field is another key: a miss."""
from __future__ import annotations

import hashlib
import inspect
import json
import os
import sysconfig
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


def cpu_isa() -> str:
    """The CPU ISA level Inductor compiles C++ kernels for: Inductor's own
    pick_vec_isa() once it has run (it compiles probes on first use, about
    10 s, so it is not called here), else ATen's CPU capability, which is
    what pick_vec_isa selects where the compiler builds it (ATEN_CPU_CAPABILITY
    overrides both)."""
    torch = _torch()
    env = os.environ.get("ATEN_CPU_CAPABILITY")
    if env:
        return env.lower()
    try:
        from torch._inductor import cpu_vec_isa
        if cpu_vec_isa.valid_vec_isa_list.cache_info().currsize:
            return str(cpu_vec_isa.pick_vec_isa()) or "none"
    except Exception:
        pass
    try:
        return str(torch.backends.cpu.get_cpu_capability()).lower()
    except Exception:
        return "unknown"


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
        idx = dev.index if dev.index is not None else torch.cuda.current_device()
        if torch.version.hip:
            props = torch.cuda.get_device_properties(idx)
            extra["gfx"] = str(getattr(props, "gcnArchName", "unknown"))[:128]
            return CPU_ARCH, extra
        major, minor = torch.cuda.get_device_capability(idx)
        return "sm_%d%d" % (major, minor), extra
    return CPU_ARCH, extra


def accel(device: Optional[str] = None) -> str:
    """"cuda-<version>", "rocm-<version>" or "cpu": what the compiled code
    is for."""
    torch = _torch()
    if device is None:
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if torch.device(device).type != "cuda":
        return "cpu"
    if torch.version.hip:
        return "rocm-%s" % torch.version.hip
    return "cuda-%s" % torch.version.cuda


def model_hash(model: Any) -> str:
    """The model's identity for a key. A 64-hex string is taken as is; any
    other string is a name (hashed); an nn.Module is hashed from its class,
    the source of its classes' forward, its repr and every parameter's and
    buffer's name, shape and dtype (not the weights: compiled code does not
    depend on their values unless Inductor's freezing is on, then pass the
    weights' hash, e.g. kcache.model_hash(files))."""
    if isinstance(model, str):
        if len(model) == 64 and all(c in "0123456789abcdef" for c in model):
            return model
        return hashlib.sha256(b"kcache-torch-model/1\0" +
                              model.encode()).hexdigest()
    h = hashlib.sha256(b"kcache-torch-module/1\0")
    h.update(type(model).__module__.encode() + b"." +
             type(model).__qualname__.encode() + b"\0")
    seen = set()
    mods = model.modules() if hasattr(model, "modules") else [model]
    for m in mods:
        cls = type(m)
        if cls in seen:
            continue
        seen.add(cls)
        try:
            h.update(inspect.getsource(cls).encode())
        except (OSError, TypeError):
            h.update(cls.__qualname__.encode())
    h.update(repr(model).encode())
    for kind in ("named_parameters", "named_buffers"):
        for name, t in getattr(model, kind, lambda: [])():
            h.update(("%s %s %s %s\n" % (kind, name, tuple(t.shape),
                                         t.dtype)).encode())
    return h.hexdigest()


def key_fields(kind: str, model: Any, layer: int = 0,
               device: Optional[str] = None,
               options: Optional[Mapping[str, Any]] = None) -> Dict[str, Any]:
    """The key fields of one bundle of `kind` ("mega", "inductor-dir",
    "triton-dir") for model on device, layer n. options: anything else that
    changes what is compiled (torch.compile's mode, dynamic, backend...)."""
    arch, extra = device_arch(device)
    tools = {"torch": torch_version(), "accel": accel(device),
             "cpu_isa": cpu_isa(),
             "python": sysconfig.get_config_var("SOABI") or "unknown"}
    tv = _triton_version()
    if tv:
        tools["triton"] = tv
    tools.update(extra)
    build = json.dumps({"builder": BUILDER, "kind": kind,
                        "options": dict(options or {})}, sort_keys=True,
                       default=str)
    return {"model": model_hash(model),
            "build": hashlib.sha256(build.encode()).hexdigest(),
            "arch": arch, "bucket": {"layer": int(layer)},
            "toolchain": tools}
