#!/usr/bin/env python3
"""entrypoint.py: start-up of a torch.compile inference server warmed from
kcached, the entrypoint form (deployment.yaml runs it as the container's
command). The order matters:

1. Inductor's remote caches on (KCACHE_RESP_URL set), before any compile;
2. the cache directories filled and the Mega-Cache loaded (each bounded by
   KCACHE_DEADLINE seconds; kcached down or a miss: torch compiles);
3. warm-up over the shape buckets the service will see;
4. on leaving the `with`: what this replica compiled that the fleet did not
   have is uploaded, by one replica (a lease), if the token may write;
5. serve.

Environment: KCACHE_URL, KCACHE_TOKEN (a read token: hits only; a write
token: the first replica of a new model version uploads), KCACHE_RESP_URL
(redis://kcached:6379, for the remote caches), TORCHINDUCTOR_CACHE_DIR
(an emptyDir), MODEL_ID (the model's identity in keys: the weights' hash or
release name), BUCKETS ("1,8,32": batch sizes), PORT.
"""
import http.server
import json
import os
import time

import torch

import kcache.torch as kt

T0 = time.time()


def load_model():
    # Stand-in for the service's model: replace with the real one.
    return torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                               torch.nn.Linear(2048, 512)).eval()


def main():
    deadline = float(os.environ.get("KCACHE_DEADLINE", "20"))
    if os.environ.get("KCACHE_RESP_URL"):
        kt.use_remote_caches()  # KCACHE_RESP_URL, KCACHE_TOKEN
    model = load_model()
    model_id = os.environ.get("MODEL_ID", "demo-model-v1")
    buckets = [int(b) for b in os.environ.get("BUCKETS", "1,8,32").split(",")]
    compiled = torch.compile(model, dynamic=True)
    with kt.cache_dir_bundle(model=model_id, deadline=deadline) as cd, \
            kt.mega_cache(model=model_id, deadline=deadline) as mc, \
            torch.no_grad():
        for b in buckets:
            compiled(torch.randn(b, 512))
    print(json.dumps({"warm_s": round(time.time() - T0, 2),
                      "mega": mc.stats, "cache_dir": cd.stats,
                      "torch_counters": kt.counters()}), flush=True)

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # /healthz: ready once warm
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok\n")

    port = int(os.environ.get("PORT", "8000"))
    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
