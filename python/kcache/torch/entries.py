"""kcache.torch.entries: TORCHINDUCTOR_CACHE_DIR as per-entry bundles.

What Inductor writes there is already content-keyed: an FX graph entry
(fxgraph/<k[1:3]>/<k>/...), an AOTAutograd entry (aotautograd/<k>/...)
and the compiled kernels (<k[1:3]>/<k>.so, .cpp, .main.so, ...: k hashes
the kernel's source and its compile command). Each entry is its own
write-once bundle:

    model = the model's hash, arch = the device's ("sm_00" on the CPU),
    toolchain = keys.toolchain(device), bucket = {<kind>: 1},
    build = SHA-256 of {"builder": "kcache-torch-entry/1", "kind",
                        "entry": the entry's id, "options"}

so one entry id has one key per toolchain and options: a second writer's
bundle under it is refused by kcached (write-once), and a bundle under any
other key is refused here unless its key is the one its own files' entry
id gives (`verify`). A reader never writes a file that is there already
(entries are linked into place, never over a file), and every file of a
bundle must lie inside its entry (`entry_of`).

`Entries.fetch()` lists the model's bundles in one request (GET
/v1/models/{model}), keeps those of this toolchain, and pulls those whose
entry the local directory lacks in one batch (Client.pull_many: one lookup,
every blob in one parallel fetch); `Entries.upload()` pushes, each under its
build lease, the local entries the listing did not have. Source files of
Python wrappers (<k>.py) are never carried: Inductor writes them again
from the FX graph entry, and they are code it imports.
"""

from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
from ctypes import POINTER, c_char_p, c_size_t, c_void_p
from typing import Any, Dict, List, Mapping, Optional, Tuple

from .. import _lib
from ..client import Client, Manifest
from ..errors import Error, Forbidden, Unauthorized
from .keys import device_arch, model_hash, toolchain

BUILDER = "kcache-torch-entry/1"
KINDS = ("fxgraph", "aotautograd", "kernel")
_KEY = re.compile(r"^[a-z0-9_]{8,128}$")
_SKIP_EXT = (".py", ".lock", ".tmp")

_lib._decl(
    "kc_client_model_list",
    ctypes.c_int,
    c_void_p,
    c_char_p,
    POINTER(c_void_p),
    _lib._ERRBUF,
    raises=True,
)
_lib._decl(
    "kc_client_warmup_put",
    ctypes.c_int,
    c_void_p,
    c_char_p,
    c_char_p,
    c_size_t,
    _lib._ERRBUF,
    raises=True,
)


def model_list(client: Client, model: str) -> Dict[str, Any]:
    """GET /v1/models/{model}: {"model", "bundles": [{key, bucket, arch,
    toolchain, ...}]}, one request."""
    p = c_void_p()
    err = _lib.errbuf()
    with client._lock:
        _lib.lib.kc_client_model_list(
            client._h(), model.encode(), ctypes.byref(p), err
        )
    return json.loads(_lib.take_string(p))


def warmup_put(
    client: Client, model: str, manifest: Mapping[str, Any]
) -> None:
    """PUT /v1/models/{model}/warmup (a write token): names the model."""
    text = json.dumps(dict(manifest), sort_keys=True).encode()
    err = _lib.errbuf()
    with client._lock:
        _lib.lib.kc_client_warmup_put(
            client._h(), model.encode(), text, len(text), err
        )


# ------------------------------------------------------------- the layout


def entry_of(rel: str) -> Optional[Tuple[str, str]]:
    """(kind, entry id) of a file's path relative to the cache directory,
    or None for a file that belongs to no entry (locks, wrappers' sources,
    Triton's directory, anything unknown)."""
    parts = rel.split("/")
    if (
        any(p in ("", ".", "..") for p in parts)
        or rel.endswith(_SKIP_EXT)
        or ".tmp" in parts[-1]
    ):
        return None
    if parts[0] == "fxgraph" and len(parts) >= 4:
        sub, key = parts[1], parts[2]
        if _KEY.match(key) and key[1:3] == sub:
            return "fxgraph", "fxgraph/%s/%s" % (sub, key)
        return None
    if parts[0] == "aotautograd" and len(parts) >= 3:
        return (
            ("aotautograd", "aotautograd/" + parts[1])
            if _KEY.match(parts[1])
            else None
        )
    if len(parts) == 2 and len(parts[0]) == 2:
        stem = parts[1].split(".", 1)[0]
        if _KEY.match(stem) and stem[1:3] == parts[0] and "." in parts[1]:
            return "kernel", "%s/%s" % (parts[0], stem)
    return None


def scan(root: str) -> Dict[str, Tuple[str, List[str]]]:
    """Every entry under root: {entry id: (kind, [relative paths])}."""
    out: Dict[str, Tuple[str, List[str]]] = {}
    if not os.path.isdir(root):
        return out
    for dirpath, dirnames, filenames in os.walk(root):
        rdir = os.path.relpath(dirpath, root)
        if rdir == ".":
            dirnames[:] = [
                d
                for d in dirnames
                if d in ("fxgraph", "aotautograd") or len(d) == 2
            ]
        for name in filenames:
            rel = (
                name if rdir == "." else rdir.replace(os.sep, "/") + "/" + name
            )
            e = entry_of(rel)
            if e is None:
                continue
            p = os.path.join(dirpath, name)
            if os.path.islink(p) or not os.path.isfile(p):
                continue
            out.setdefault(e[1], (e[0], []))[1].append(rel)
    for _, files in out.values():
        files.sort()
    return out


def fields(
    model: str,
    kind: str,
    entry: str,
    device: Optional[str],
    tools: Mapping[str, str],
    arch: str,
    options: Optional[Mapping[str, Any]] = None,
) -> Dict[str, Any]:
    build = json.dumps(
        {
            "builder": BUILDER,
            "kind": kind,
            "entry": entry,
            "options": dict(options or {}),
        },
        sort_keys=True,
        default=str,
    )
    return {
        "model": model,
        "arch": arch,
        "bucket": {kind: 1},
        "toolchain": dict(tools),
        "build": hashlib.sha256(build.encode()).hexdigest(),
    }


# ------------------------------------------------------------ the engine


class Entries:
    """The per-entry bundles of one model and one cache directory.
    fetch() before the first compile, upload() after; `stats` counts:
    listed, fetched, present (already local), refused, uploaded, taken
    (another process's lease or bundle), failed."""

    def __init__(
        self,
        client: Client,
        model: Any,
        root: str,
        device: Optional[str] = None,
        options: Optional[Mapping[str, Any]] = None,
        name: Optional[str] = None,
        lease_ttl: int = 600,
    ):
        self.client = client
        self.root = os.path.abspath(root)
        self.model = model_hash(model)
        self.name = name
        self.device = device
        self.options = dict(options or {})
        self.arch, _ = device_arch(device)
        self.tools = toolchain(device)
        self.lease_ttl = lease_ttl
        self.listed: Optional[Dict[str, Dict[str, Any]]] = None
        self.cancel = threading.Event()
        self.stats: Dict[str, Any] = {
            "listed": 0,
            "fetched": 0,
            "present": 0,
            "refused": 0,
            "uploaded": 0,
            "taken": 0,
            "failed": 0,
            "fetched_bytes": 0,
            "uploaded_bytes": 0,
        }

    def fields_of(self, kind: str, entry: str) -> Dict[str, Any]:
        """The key fields of one entry of this toolchain."""
        return fields(
            self.model,
            kind,
            entry,
            self.device,
            self.tools,
            self.arch,
            self.options,
        )

    def key_of(self, kind: str, entry: str) -> str:
        return Client.key(self.fields_of(kind, entry))

    def _mine(self, b: Mapping[str, Any]) -> bool:
        bucket = b.get("bucket") or {}
        return (
            b.get("arch") == self.arch
            and b.get("toolchain") == self.tools
            and len(bucket) == 1
            and next(iter(bucket)) in KINDS
        )

    def list(self) -> Dict[str, Dict[str, Any]]:
        """This toolchain's bundles of the model, by key (one request)."""
        got = model_list(self.client, self.model)
        self.listed = {
            b["key"]: b for b in got.get("bundles", []) if self._mine(b)
        }
        self.stats["listed"] = len(self.listed)
        return self.listed

    def verify(self, m: Manifest) -> Optional[str]:
        """The entry id of a pulled bundle when it is what its key names:
        every file inside one entry, and the key that entry has here.
        None: refused."""
        ids = {entry_of(f["path"]) for f in m.files}
        if len(ids) != 1 or None in ids:
            return None
        kind, entry = ids.pop()  # type: ignore[misc]
        return entry if self.key_of(kind, entry) == m.key else None

    def _place(self, m: Manifest) -> int:
        """Links m's files into root where absent (never over a file):
        materialized into a staging directory on the same file system
        first, so each file appears whole."""
        n = 0
        stage = tempfile.mkdtemp(prefix=".kcache-stage-", dir=self.root)
        try:
            self.client.materialize(m, stage)
            for f in m.files:
                src = os.path.join(stage, f["path"])
                dst = os.path.join(self.root, f["path"])
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                try:
                    os.link(src, dst)
                except FileExistsError:
                    continue
                except OSError:  # no hard links here: a copy, linked in
                    if os.path.exists(dst):
                        continue
                    # (a file system without hard links: a whole copy
                    # renamed in, unless a file came meanwhile)
                    tmp = os.path.join(stage, ".copy")
                    shutil.copyfile(src, tmp)
                    if os.path.exists(dst):
                        continue
                    os.rename(tmp, dst)
                n += 1
        finally:
            shutil.rmtree(stage, ignore_errors=True)
        return n

    def fetch(self) -> None:
        """List, then pull every listed entry the directory lacks in one
        batch (one lookup, every blob in one parallel fetch, verified), and
        place each that passes `verify`. Raises what the listing raised; a
        bundle that fails is counted and skipped."""
        os.makedirs(self.root, exist_ok=True)
        listed = self.list()
        local = {
            self.key_of(kind, e) for e, (kind, _) in scan(self.root).items()
        }
        want = sorted(k for k in listed if k not in local)
        self.stats["present"] += len(listed) - len(want)
        if not want or self.cancel.is_set():
            return
        try:
            got = self.client.pull_many(want)
        except Error:
            got = {}
        for key in want:
            m = got.get(key)
            if m is None:
                self.stats["failed"] += 1
            elif self.verify(m) is None:
                self.stats["refused"] += 1
            else:
                self._place(m)
                self.stats["fetched"] += 1
                self.stats["fetched_bytes"] += m.bytes

    def upload(self) -> None:
        """Pushes each local entry the listing lacked, under its lease
        (granted: upload; present or held: another process did or does).
        Needs a listing (fetch() or list()); stops at a refused token."""
        if self.listed is None:
            return
        for entry, (kind, files) in sorted(scan(self.root).items()):
            key = self.key_of(kind, entry)
            if key in self.listed:
                continue
            try:
                lease = self.client.lease_take(key, self.lease_ttl)
            except (Forbidden, Unauthorized) as e:
                self.stats["upload"] = "skipped: %s" % e.name
                return
            except Error:
                self.stats["failed"] += 1
                continue
            if not lease.granted:
                self.stats["taken"] += 1
                continue
            try:
                m = self._push(kind, entry, files)
                self.listed[key] = {"key": key}
                self.stats["uploaded"] += 1
                self.stats["uploaded_bytes"] += m.bytes
            except Error:
                self.stats["failed"] += 1
            finally:
                try:
                    self.client.lease_release(lease)
                except Error:
                    pass

    def _push(self, kind: str, entry: str, files: List[str]) -> Manifest:
        f = self.fields_of(kind, entry)
        with tempfile.TemporaryDirectory(prefix="kcache-entry-") as tmp:
            for rel in files:
                dst = os.path.join(tmp, rel)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                try:
                    os.link(os.path.join(self.root, rel), dst)
                except OSError:
                    shutil.copyfile(os.path.join(self.root, rel), dst)
            return self.client.push_dir(tmp, f)

    def name_model(self) -> None:
        """Names the model (its warmup manifest: one bucket per kind, the
        arch): what `kcache ls` and the page show. A write token; a name
        another model holds is refused by kcached (stats say so)."""
        if not self.name:
            return
        w = {
            "schema": "kcache.warmup/v1",
            "model": {"name": self.name, "hash": self.model},
            "archs": [self.arch],
            "buckets": [{k: 1} for k in KINDS],
            "builder": {
                "command": ["kcache-torch-entries-are-built-by-torch.compile"]
            },
        }
        try:
            warmup_put(self.client, self.model, w)
            self.stats["name"] = "named"
        except Error as e:
            self.stats["name"] = "skipped: %s" % e.name
