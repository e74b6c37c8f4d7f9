#!/usr/bin/env python3
"""entrypoint.py: start-up of a torch.compile inference server warmed from
kcached, the entrypoint form (deployment.yaml runs it as the container's
command; Dockerfile builds its image). The order matters:

1. Inductor's remote caches on (KCACHE_RESP_URL set), before any compile;
2. kcache.torch.warm(model): torch's local caches filled from kcached before
   the first compile, bounded by KCACHE_DEADLINE seconds (kcached down or a
   miss: torch compiles);
3. warm-up over the shape buckets the service will see;
4. on leaving the `with`: what this replica compiled that the fleet did not
   have is uploaded, if the token may write;
5. serve.

Environment: KCACHE_URL (https://kcached:8080), KCACHE_TOKEN (a read
token: hits only; a write token: the first replica of a new model version
uploads), KCACHE_CACERT (the CA of kcached's certificate: without it, TLS
fails and every replica compiles cold), KCACHE_RESP_URL
(rediss://kcached:6379/?ssl_ca_certs=CA, for the remote caches), KCACHE_DIR
and TORCHINDUCTOR_CACHE_DIR (emptyDirs), MODEL_ID (the model's name in
keys), BUCKETS ("1,8,32": batch sizes), PORT.
"""

import contextlib
import http.server
import json
import os
import time

import torch

import kcache.torch as kt

T0 = time.time()


def load_model():
    # Stand-in for the service's model: replace with the real one.
    return torch.nn.Sequential(
        torch.nn.Linear(512, 2048), torch.nn.GELU(), torch.nn.Linear(2048, 512)
    ).eval()


@contextlib.contextmanager
def warm(model, name, deadline):
    """kcache.torch.warm where the package has it; else its parts (the
    cache-dir bundle and the Mega-Cache). Yields a dict of stats."""
    if getattr(kt, "warm", None):
        with kt.warm(model, name=name, deadline=deadline) as w:
            yield {"warm": w.stats}
        return
    with (
        kt.cache_dir_bundle(model=name, deadline=deadline) as cd,
        kt.mega_cache(model=name, deadline=deadline) as mc,
    ):
        yield {"cache_dir": cd.stats, "mega": mc.stats}


def main():
    deadline = float(os.environ.get("KCACHE_DEADLINE", "20"))
    if os.environ.get("KCACHE_RESP_URL"):
        kt.use_remote_caches()  # KCACHE_RESP_URL, KCACHE_TOKEN
    model = load_model()
    name = os.environ.get("MODEL_ID", "demo-model-v1")
    buckets = [int(b) for b in os.environ.get("BUCKETS", "1,8,32").split(",")]
    with warm(model, name, deadline) as stats, torch.no_grad():
        compiled = torch.compile(model, dynamic=True)
        for b in buckets:
            compiled(torch.randn(b, 512))
    print(
        json.dumps(
            {
                "warm_s": round(time.time() - T0, 2),
                "kcache": stats,
                "torch_counters": kt.counters(),
            }
        ),
        flush=True,
    )

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # /healthz: ready once warm
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok\n")

    port = int(os.environ.get("PORT", "8000"))
    http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler).serve_forever()


if __name__ == "__main__":
    main()
