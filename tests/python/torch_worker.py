#!/usr/bin/env python3
"""torch_worker.py: one service process that compiles the test model through
kcache and prints one JSON line ("RESULT {...}") with what happened.

The model: an MLP and an attention block, each torch.compile'd, the batch
dimension dynamic (torch._dynamo.mark_dynamic), run on two batch sizes and
compared with eager. Used by tests/python (pytest), tests/bench/bench_torch
and scripts/gpu_torch_check.py.

usage: torch_worker.py --path none|warm|remote|mega|cachedir|triton|all
                       [--device cpu|cuda] [--no-upload] [--fake-torch-version V]
                       [--model pair|pair2|lazy|gpt2] [--name NAME]
--path warm is the one call (kcache.torch.warm); --model picks the model
(pair: the MLP and attention block; pair2: the same with another width, a
second model; lazy: the MLP with nn.LazyLinear; gpt2: transformers' GPT-2
architecture from a small config, random weights, no download).
Environment: KCACHE_URL, KCACHE_TOKEN, KCACHE_RESP_URL (remote path),
TORCHINDUCTOR_CACHE_DIR, TRITON_CACHE_DIR, KCACHE_T0 (the parent's
time.time() before it started this process: first_output_s counts from
it, so interpreter start and imports are in).
"""

import argparse
import json
import os
import sys
import time

T_START = float(os.environ.get("KCACHE_T0") or time.time())


def build_models(torch, device, hidden=256, lazy=False):
    nn = torch.nn

    class MLP(nn.Module):
        def __init__(self, d=64, h=hidden):
            super().__init__()
            self.fc1 = nn.LazyLinear(h) if lazy else nn.Linear(d, h)
            self.fc2 = nn.Linear(h, h)
            self.fc3 = nn.Linear(h, d)

        def forward(self, x):
            x = torch.nn.functional.gelu(self.fc1(x))
            x = torch.relu(self.fc2(x)) + x.mean(dim=-1, keepdim=True)
            return self.fc3(x).softmax(-1)

    class Attention(nn.Module):
        def __init__(self, d=64, heads=4):
            super().__init__()
            self.heads = heads
            self.qkv = nn.Linear(d, 3 * d)
            self.out = nn.Linear(d, d)
            self.norm = nn.LayerNorm(d)

        def forward(self, x):
            b, s, d = x.shape
            q, k, v = self.qkv(self.norm(x)).chunk(3, dim=-1)
            q = q.view(b, s, self.heads, d // self.heads).transpose(1, 2)
            k = k.view(b, s, self.heads, d // self.heads).transpose(1, 2)
            v = v.view(b, s, self.heads, d // self.heads).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (d // self.heads) ** -0.5
            y = att.softmax(-1) @ v
            y = y.transpose(1, 2).reshape(b, s, d)
            return x + self.out(y)

    class Pair(nn.Module):
        """The model's identity for kcache: both blocks."""

        def __init__(self):
            super().__init__()
            self.mlp = MLP()
            self.attn = Attention()

    torch.manual_seed(0)
    return Pair().to(device).eval()


def build_gpt2(torch, device):
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(
        n_layer=2, n_embd=64, n_head=4, vocab_size=512, n_positions=64
    )
    return GPT2LMHeadModel(cfg).to(device).eval()


def run_gpt2(torch, a, model):
    """The first output of a compiled GPT-2 on two batch sizes."""
    compiled = torch.compile(model)
    equal, first = True, None
    with torch.no_grad():
        for batch in (2, 3):
            g = torch.Generator().manual_seed(batch)
            ids = torch.randint(0, 512, (batch, 16), generator=g).to(a.device)
            y = compiled(input_ids=ids).logits
            if first is None:
                first = time.time() - T_START
            e = model(input_ids=ids).logits
            equal = equal and torch.allclose(y, e, atol=1e-4, rtol=1e-4)
    return first, equal


def inputs(torch, device, batch):
    g = torch.Generator().manual_seed(batch)
    return (
        torch.randn(batch, 64, generator=g).to(device),
        torch.randn(batch, 16, 64, generator=g).to(device),
    )


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--path",
        default="none",
        choices=[
            "none",
            "warm",
            "remote",
            "mega",
            "cachedir",
            "triton",
            "all",
            "prepopulate",
            "eager",
        ],
    )
    ap.add_argument(
        "--model", default="pair", choices=["pair", "pair2", "lazy", "gpt2"]
    )
    ap.add_argument("--name")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--no-upload", action="store_true")
    ap.add_argument("--fake-torch-version")
    ap.add_argument("--deadline", type=float, default=20.0)
    a = ap.parse_args()

    import contextlib
    import torch

    t_import = time.time() - T_START
    import kcache.torch as kt

    if a.fake_torch_version:
        import kcache.torch.keys as ktk

        ktk.torch_version = kt.torch_version = lambda: a.fake_torch_version
    paths = (
        {"remote", "mega", "cachedir", "triton"}
        if a.path == "all"
        else {a.path}
    )
    if "remote" in paths:
        kt.use_remote_caches(os.environ["KCACHE_RESP_URL"])
    if "triton" in paths:
        os.environ.setdefault(
            "TRITON_CACHE_MANAGER", "kcache.triton:CacheManager"
        )
    if a.model == "gpt2":
        model = build_gpt2(torch, a.device)
    else:
        model = build_models(
            torch,
            a.device,
            hidden=128 if a.model == "pair2" else 256,
            lazy=a.model == "lazy",
        )
    up = not a.no_upload
    if a.path == "eager":  # the floor: imports and eager forwards
        return eager(torch, a, model)
    if a.path == "prepopulate":
        return prepopulate(torch, kt, model, a)
    stack = contextlib.ExitStack()
    mc = cd = w = None
    with stack:
        if "warm" in paths:
            w = stack.enter_context(
                kt.warm(
                    model,
                    a.name,
                    device=a.device,
                    upload=up,
                    deadline=a.deadline,
                )
            )
        if "cachedir" in paths:
            cd = stack.enter_context(
                kt.cache_dir_bundle(
                    model=model,
                    device=a.device,
                    upload=up,
                    deadline=a.deadline,
                )
            )
        if "mega" in paths:
            mc = stack.enter_context(
                kt.mega_cache(
                    model=model,
                    device=a.device,
                    upload=up,
                    deadline=a.deadline,
                )
            )
        if a.model == "gpt2":
            first, equal = run_gpt2(torch, a, model)
        else:
            mlp = torch.compile(model.mlp)
            attn = torch.compile(model.attn)
            equal = True
            first = None
        with torch.no_grad():
            for batch in () if a.model == "gpt2" else (4, 7):
                x, s = inputs(torch, a.device, batch)
                torch._dynamo.mark_dynamic(x, 0)
                torch._dynamo.mark_dynamic(s, 0)
                y1, y2 = mlp(x), attn(s)
                if a.device.startswith("cuda"):
                    torch.cuda.synchronize()
                if first is None:
                    first = time.time() - T_START
                e1, e2 = model.mlp(x), model.attn(s)
                equal = (
                    equal
                    and torch.allclose(y1, e1, atol=1e-4, rtol=1e-4)
                    and torch.allclose(y2, e2, atol=1e-4, rtol=1e-4)
                )
        counters = kt.counters()
    res = {
        "first_output_s": round(first, 4),
        "import_s": round(t_import, 4),
        "equal": bool(equal),
        "counters": counters,
        "frame_count": int(
            torch._dynamo.utils.counters["stats"].get("unique_graphs", 0)
        ),
        "torch": str(torch.__version__),
        "phases": {
            k: round(sum(v), 4)
            for k, v in torch._dynamo.utils.compilation_time_metrics.items()
        },
    }
    if w is not None:
        res["warm"] = w.stats
    if mc is not None:
        res["mega"] = mc.stats
    if cd is not None:
        res["cachedir"] = cd.stats
    if "triton" in paths or os.environ.get("TRITON_CACHE_MANAGER"):
        try:
            import kcache.triton as ktr

            res["triton"] = ktr.stats()
        except Exception as e:  # no triton here
            res["triton"] = {"error": str(e)}
    print("RESULT " + json.dumps(res, default=str), flush=True)
    return 0


def eager(torch, a, model):
    with torch.no_grad():
        if a.model == "gpt2":
            model(input_ids=torch.zeros(2, 16, dtype=torch.long))
        else:
            x, s = inputs(torch, a.device, 4)
            model.mlp(x), model.attn(s)
    res = {
        "first_output_s": round(time.time() - T_START, 4),
        "equal": True,
        "counters": {},
        "phases": {},
    }
    print("RESULT " + json.dumps(res), flush=True)
    return 0


def prepopulate(torch, kt, model, a):
    """CI's form: kcache.torch.prepopulate over the two batch buckets, with
    the remote caches on (the service then runs --path all)."""
    mlp = torch.compile(model.mlp)
    attn = torch.compile(model.attn)
    buckets = []
    for batch in (4, 7):
        x, s = inputs(torch, a.device, batch)
        torch._dynamo.mark_dynamic(x, 0)
        torch._dynamo.mark_dynamic(s, 0)
        buckets.append((x, s))
    with torch.no_grad():
        res = kt.prepopulate(
            lambda x, s: (mlp(x), attn(s)),
            buckets,
            model=model,
            name=a.name,
            device=a.device,
            compile_fn=False,
        )
    res["equal"] = True
    res["first_output_s"] = time.time() - T_START
    print("RESULT " + json.dumps(res, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
