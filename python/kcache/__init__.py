"""kcache: the Python client of kcached, the compiled-kernel cache.

A binding of libkcache (client/kcache.h) through ctypes: the protocol, the
SHA-256 verification and the local cache are the C library's. The package
carries libkcache.so (or finds it through $KCACHE_LIB).

    import kcache
    c = kcache.Client()                 # KCACHE_URL, KCACHE_TOKEN, KCACHE_DIR
    report = c.warm("warmup.json", out="kernels/", deadline=30)
    m = c.pull(key); c.materialize(m, "dir/")

Submodules: kcache.torch (torch.compile: Inductor remote caches, Mega-Cache,
cache-dir bundles, prepopulation) and kcache.triton (a Triton cache manager,
TRITON_CACHE_MANAGER=kcache.triton:CacheManager). Neither imports torch or
triton before it is used.
"""

from .client import (
    Client,
    Lease,
    Manifest,
    arch_valid,
    canonical_key_json,
    key,
    model_hash,
    sha256_hex,
)
from .errors import (
    Conflict,
    Corrupt,
    Error,
    Forbidden,
    InvalidArgument,
    NotFound,
    Timeout,
    Unauthorized,
    Unavailable,
)
from ._lib import LIB_PATH

__version__ = "0.1.0"

__all__ = [
    "Client",
    "Lease",
    "Manifest",
    "Error",
    "NotFound",
    "Unavailable",
    "Timeout",
    "Unauthorized",
    "Forbidden",
    "Conflict",
    "Corrupt",
    "InvalidArgument",
    "key",
    "canonical_key_json",
    "sha256_hex",
    "model_hash",
    "arch_valid",
    "LIB_PATH",
    "__version__",
]
