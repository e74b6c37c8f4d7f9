"""firsthour_worker: one fresh process of a torch or Triton user, in the
environment that run.sh's printed lines made (test_firsthour.py runs it
through bash after those lines). Prints one JSON line.

    firsthour_worker.py torch            a small torch.compile on the CPU:
                                         Inductor's FX graph cache counters
    firsthour_worker.py triton-put KEY   Triton's cache manager for KEY puts
                                         a kernel's group (what
                                         triton.compile does on a miss)
    firsthour_worker.py triton-get KEY   the same key's group, from an
                                         empty TRITON_CACHE_DIR
"""

import json
import sys

FILES = {
    "k.cubin": b"\x7fELF" + bytes(range(256)) * 8,
    "k.ptx": b"// ptx\n.version 8.4\n",
    "k.json": b'{"name": "k"}',
}


def run_torch():
    import torch
    from torch._dynamo.utils import counters

    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8)
    )
    compiled = torch.compile(model)
    with torch.no_grad():
        y = compiled(torch.randn(4, 32))
    print(
        json.dumps(
            {"shape": list(y.shape), "inductor": dict(counters["inductor"])}
        )
    )


def run_triton(op, key):
    from triton.runtime.cache import get_cache_manager

    m = get_cache_manager(key)
    out = {"manager": type(m).__module__ + "." + type(m).__name__}
    if op == "triton-put":
        out["before"] = m.get_group("k.json") is not None
        group = {
            name: m.put(data, name, binary=True)
            for name, data in FILES.items()
        }
        m.put_group("k.json", group)
    else:
        g = m.get_group("k.json") or {}
        out["files"] = {
            name: open(p, "rb").read() == FILES.get(name)
            for name, p in g.items()
        }
    import kcache.triton

    out["stats"] = kcache.triton.stats()
    print(json.dumps(out))


if __name__ == "__main__":
    if sys.argv[1] == "torch":
        run_torch()
    else:
        run_triton(sys.argv[1], sys.argv[2])
