"""kcache.triton: a Triton cache manager backed by kcached.

    export TRITON_CACHE_MANAGER=kcache.triton:CacheManager
    export KCACHE_URL=http://kcached:8080 KCACHE_TOKEN=...   # or none: local

It is Triton's FileCacheManager (the same local directory, TRITON_CACHE_DIR,
the same files), plus, for each compiled kernel's group (what
`triton.compile` looks up with get_group and writes with put_group): a
miss in the local directory pulls the group's bundle from kcached through
libkcache (the manifest, then its blobs in one batch, each SHA-256
verified) and writes it into the directory; a new group is uploaded as one
bundle. The launcher modules Triton builds with the C compiler
(`<name>.cpython-...so`, get_file/put outside any group) are cached the same
way, one file per bundle.

Never fails a compile because of kcache: kcached down, a refused token or a
corrupt answer means Triton compiles locally; a read-only token serves hits
and skips uploads (once refused, the process stops trying). After a failure
to reach kcached, it is not asked again for KCACHE_TRITON_RETRY_S (30) s.

Works with Triton 3.3 (no knobs module: directories from the environment)
through the newest; the override and dump managers stay purely local.

The bundle key (docs/DESIGN.md, "Python package"): model = SHA-256 of
"kcache-triton/1", build = SHA-256 of Triton's cache key and the file name,
arch = $KCACHE_ARCH or "sm_00" (Triton's key holds the target already),
toolchain = {"triton": version, "python": the ABI}, bucket = {"group": 1}.
Triton's own key already binds the compiler, the source, the target and
the options; the extra fields keep bundles apart per Triton version and Python ABI.
"""

from __future__ import annotations

import json
import logging
import os
import sysconfig
import threading
import time
from typing import Any, Dict, Optional

from triton.runtime.cache import FileCacheManager

from .client import Client, sha256_hex
from .errors import Error, Forbidden, NotFound, Unauthorized, Unavailable

log = logging.getLogger("kcache.triton")

_MODEL = sha256_hex(b"kcache-triton/1")
_GRP = "__grp__"


class _Remote:
    """The process's one client for Triton, made on first use, and what
    it has learnt: kcached unreachable (until retry_at), uploads refused."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.client: Optional[Client] = None
        self.made = False
        self.retry_at = 0.0
        self.read_only = False
        self.stats = {
            "hits": 0,
            "misses": 0,
            "uploads": 0,
            "errors": 0,
            "skipped_uploads": 0,
        }

    def get(self) -> Optional[Client]:
        with self.lock:
            if time.monotonic() < self.retry_at:
                return None
            if not self.made:
                self.made = True
                url = os.environ.get("KCACHE_URL")
                if not url:
                    # the one line that says why nothing is shared: a
                    # manager set without its server is a setup mistake
                    log.warning(
                        "kcache.triton: KCACHE_URL is not set: Triton's "
                        "cache stays local (no kcached)"
                    )
                    return None
                try:
                    self.client = Client(
                        url=url,
                        timeout=float(
                            os.environ.get("KCACHE_TRITON_TIMEOUT", "30")
                        ),
                        connect_timeout=2.0,
                    )
                except Error as e:
                    log.warning("kcache.triton: no client (%s); local only", e)
            return self.client

    def failed(self, e: Error) -> None:
        with self.lock:
            self.stats["errors"] += 1
            if isinstance(e, (Unavailable,)) or e.name in ("KC_TIMEOUT",):
                self.retry_at = time.monotonic() + float(
                    os.environ.get("KCACHE_TRITON_RETRY_S", "30")
                )
            if isinstance(e, (Forbidden, Unauthorized)):
                self.read_only = True
        log.info("kcache.triton: %s", e)

    def reset(self) -> None:
        """Forget the client and what was learnt (tests, forks)."""
        with self.lock:
            if self.client:
                self.client.close()
            self.client = None
            self.made = False
            self.retry_at = 0.0
            self.read_only = False
            for k in self.stats:
                self.stats[k] = 0


_remote = _Remote()


def stats() -> Dict[str, int]:
    """This process's counts: group hits and misses at kcached, uploads,
    uploads skipped (read-only token), errors (each one a local compile)."""
    return dict(_remote.stats)


def reset() -> None:
    """Drops the process's client (it is made again from the environment)."""
    _remote.reset()


def _arch() -> str:
    """The key's arch: $KCACHE_ARCH, else "sm_00". Never asked of the
    driver: Inductor compiles Triton kernels in worker processes, where a
    driver call would set up CUDA, and a worker and its parent must compute
    the same key. Triton's own key, in `build`, already binds the target
    (its backend hash holds the arch, "cuda" and 90 for an H100)."""
    arch = os.environ.get("KCACHE_ARCH", "")
    return arch if arch else "sm_00"


def _version() -> str:
    import triton

    return str(getattr(triton, "__version__", "unknown"))


def _fields(triton_key: str, filename: str) -> Dict[str, Any]:
    return {
        "model": _MODEL,
        "build": sha256_hex(("%s\0%s" % (triton_key, filename)).encode()),
        "arch": _arch(),
        "bucket": {"group": 1},
        "toolchain": {
            "triton": _version(),
            "python": sysconfig.get_config_var("SOABI") or "?",
        },
    }


class CacheManager(FileCacheManager):
    """Triton's CacheManager interface (get_file, put, get_group,
    put_group) over a local directory, backed by kcached."""

    def __init__(self, key: str, override: bool = False, dump: bool = False):
        super().__init__(key, override=override, dump=dump)
        self._remote_ok = not (override or dump)

    # ---- groups: what triton.compile looks up and writes ----
    def get_group(self, filename: str) -> Optional[Dict[str, str]]:
        group = super().get_group(filename)
        if self._complete(filename, group) or not self._remote_ok:
            return group
        if self._fetch(filename):
            return super().get_group(filename)
        return group

    def put_group(self, filename: str, group: Dict[str, str]) -> str:
        path = super().put_group(filename, group)
        if self._remote_ok:
            self._upload(filename, group)
        return path

    # ---- single files: the launcher modules Triton builds with cc ----
    def get_file(self, filename: str) -> Optional[str]:
        path = super().get_file(filename)
        if path is None and self._remote_ok and self._is_module(filename):
            if self._fetch(filename, single=True):
                path = super().get_file(filename)
        return path

    def put(self, data: Any, filename: str, binary: bool = True) -> str:
        path = super().put(data, filename, binary)
        if self._remote_ok and self._is_module(filename):
            self._upload(filename, {filename: path}, single=True)
        return path

    # ---- internals ----
    @staticmethod
    def _is_module(filename: str) -> bool:
        suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
        return filename.endswith(suffix) and not filename.startswith(_GRP)

    def _complete(
        self, filename: str, group: Optional[Dict[str, str]]
    ) -> bool:
        return bool(group) and filename in group

    def _fetch(self, filename: str, single: bool = False) -> bool:
        """Pulls the bundle of (key, filename) into the directory; the group
        file is written last, with this directory's paths."""
        c = _remote.get()
        if c is None:
            return False
        k = Client.key(_fields(self.key, filename))
        try:
            m = c.pull(k)
            names = [f["path"] for f in m.files]
            for name in names:
                if name.startswith(_GRP) or "/" in name:
                    continue
                super().put(c.file_bytes(m, name), name, binary=True)
            if not single:
                grp = _GRP + filename
                if grp not in names:
                    return False
                data = json.loads(c.file_bytes(m, grp))
                children = data.get("child_paths", {})
                local = {
                    n: self._make_path(n)
                    for n in children
                    if os.path.exists(self._make_path(n))
                }
                if len(local) != len(children):
                    return False
                super().put(
                    json.dumps({"child_paths": local}), grp, binary=False
                )
            _remote.stats["hits"] += 1
            return True
        except NotFound:
            _remote.stats["misses"] += 1
        except Error as e:
            _remote.failed(e)
        except (OSError, ValueError) as e:  # a bad group file: compile
            log.info("kcache.triton: skipped %s: %s", k, e)
        return False

    def _upload(
        self, filename: str, group: Dict[str, str], single: bool = False
    ) -> None:
        """The group's files (by base name) and a group file naming them
        relatively, as one bundle. Skipped when refused before."""
        if _remote.read_only:
            _remote.stats["skipped_uploads"] += 1
            return
        c = _remote.get()
        if c is None:
            return
        import tempfile

        try:
            with tempfile.TemporaryDirectory(prefix="kcache-triton-") as d:
                children = {}
                for name, p in group.items():
                    base = os.path.basename(p)
                    if not os.path.isfile(p) or base.startswith(_GRP):
                        continue
                    _link_or_copy(p, os.path.join(d, base))
                    children[name] = base
                if not single:
                    with open(os.path.join(d, _GRP + filename), "w") as f:
                        json.dump({"child_paths": children}, f)
                c.push_dir(d, _fields(self.key, filename))
            _remote.stats["uploads"] += 1
        except (Forbidden, Unauthorized) as e:
            _remote.failed(e)
            _remote.stats["skipped_uploads"] += 1
        except Error as e:
            if e.name != "KC_CONFLICT":  # another process uploaded first
                _remote.failed(e)
        except OSError as e:
            log.info("kcache.triton: upload of %s skipped: %s", filename, e)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another file system
        with open(src, "rb") as fi, open(dst, "wb") as fo:
            fo.write(fi.read())
