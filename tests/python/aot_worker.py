#!/usr/bin/env python3
"""aot_worker.py: one service (or CI) process of kcache.torch.compile's
compiled artifacts (AOTInductor), printing one JSON line "RESULT {...}".

Models: "pair" (the test model of torch_worker.py, its MLP and attention
block called together: forward(x, y)), "gpt2" and "llama" (transformers
GPT-2 and Llama built from a tiny config, nothing downloaded; the service
asks for their logits).
Buckets are batch sizes; --check batch sizes are compared with eager.

usage: aot_worker.py --mode publish|serve|eager|tcompile|keys
         [--model pair|gpt2|llama] [--buckets 4,16] [--check 3,4,9,16]
         [--name NAME] [--no-build] [--fallback compile|eager]
         [--build-wait S] [--fake-torch-version V] [--isa LABEL]
serve: kcache.torch.compile; eager: the model as it is (the floor);
tcompile: plain torch.compile (cold, or warm from TORCHINDUCTOR_CACHE_DIR);
keys: the bucket keys for --isa (no torch compile). KCACHE_T0: the parent's
time.time() before it started this process (first_output_s counts from it).
"""

import argparse
import json
import os
import sys
import time

T_START = float(os.environ.get("KCACHE_T0") or time.time())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))


def pair_model(torch):
    from torch_worker import build_models

    pair = build_models(torch, "cpu")

    class PairCall(torch.nn.Module):
        """Both blocks of the test model in one exportable call."""

        def __init__(self, pair):
            super().__init__()
            self.mlp = pair.mlp
            self.attn = pair.attn

        def forward(self, x, y):
            return self.mlp(x), self.attn(y)

    def example(b):
        g = torch.Generator().manual_seed(b)
        return (
            torch.randn(b, 64, generator=g),
            torch.randn(b, 16, 64, generator=g),
        )

    return PairCall(pair).eval(), example


def lm_model(torch, arch):
    """A transformers causal LM from a tiny config (GPT-2 or Llama)."""
    import transformers

    torch.manual_seed(0)
    if arch == "llama":
        cfg = transformers.LlamaConfig(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            vocab_size=1000,
            max_position_embeddings=64,
        )
        lm = transformers.LlamaForCausalLM(cfg).eval()
    else:
        cfg = transformers.GPT2Config(
            n_layer=2, n_embd=128, n_head=4, vocab_size=1000, n_positions=64
        )
        lm = transformers.GPT2LMHeadModel(cfg).eval()

    class Logits(torch.nn.Module):
        """What the service calls: the logits of a batch of token ids."""

        def __init__(self, lm):
            super().__init__()
            self.lm = lm

        def forward(self, ids):
            return self.lm(input_ids=ids, use_cache=False, return_dict=False)[
                0
            ]

    def example(b):
        g = torch.Generator().manual_seed(b)
        return (torch.randint(0, 1000, (b, 32), generator=g),)

    return Logits(lm).eval(), example


def close(torch, a, b):
    if isinstance(a, (tuple, list)):
        return len(a) == len(b) and all(
            close(torch, x, y) for x, y in zip(a, b)
        )
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-3, atol=1e-3)


def strided(t):
    """t's values in non-contiguous strides."""
    if t.dim() < 2:
        return t
    return t.transpose(0, -1).contiguous().transpose(0, -1)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="serve")
    ap.add_argument("--model", default="pair")
    ap.add_argument("--buckets", default="4,16")
    ap.add_argument("--check", default="")
    ap.add_argument("--name", default="aot-test")
    ap.add_argument("--no-build", action="store_true")
    ap.add_argument("--fallback", default="compile")
    ap.add_argument("--build-wait", type=float, default=None)
    ap.add_argument("--deadline", type=float, default=10.0)
    ap.add_argument("--fake-torch-version", default=None)
    ap.add_argument("--isa", default=None)
    a = ap.parse_args()
    import torch

    if a.fake_torch_version:
        torch.__version__ = a.fake_torch_version
    if a.model in ("gpt2", "llama"):
        model, example = lm_model(torch, a.model)
    else:
        model, example = pair_model(torch)
    batches = [int(b) for b in a.buckets.split(",") if b]
    buckets = [example(b) for b in batches]
    res = {"mode": a.mode}
    if a.mode == "keys":
        from kcache.client import key
        from kcache.torch import aot, keys

        mh = keys.model_hash(model)
        res["fields"] = [
            aot.bucket_fields(mh, b, "cpu", a.isa, a.name)
            for b in aot.make_buckets(buckets)
        ]
        res["keys"] = [key(f) for f in res["fields"]]
        print("RESULT " + json.dumps(res), flush=True)
        return
    if a.mode == "publish":
        from kcache.torch import aot

        res["publish"] = aot.publish(model, buckets, name=a.name)
        print("RESULT " + json.dumps(res), flush=True)
        return
    with torch.no_grad():
        if a.mode == "eager":
            fn = model
        elif a.mode == "tcompile":
            fn = torch.compile(model)
        else:
            import kcache.torch as kt

            fn = kt.compile(
                model,
                name=a.name,
                buckets=buckets,
                build=not a.no_build,
                fallback=a.fallback,
                build_wait=a.build_wait,
                deadline=a.deadline,
            )
            res["stats"] = fn.stats
        fn(*buckets[0])
        res["first_output_s"] = round(time.time() - T_START, 4)
        res["compile_stack"] = sorted(
            m for m in ("torch._inductor", "torch._dynamo") if m in sys.modules
        )
        checks = [int(b) for b in a.check.split(",") if b]
        res["equal"] = all(
            close(torch, fn(*example(b)), model(*example(b))) for b in checks
        )
        # the same values in other strides (a transposed copy's view)
        res["equal_strided"] = all(
            close(
                torch,
                fn(*[strided(t) for t in example(b)]),
                model(*example(b)),
            )
            for b in checks
        )
        res["checked"] = checks
    print("RESULT " + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
