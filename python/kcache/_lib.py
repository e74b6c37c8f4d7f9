"""_lib: loads libkcache.so and declares the C functions the package calls.

ctypes, not an extension module: the package compiles nothing against
Python, so one build of libkcache.so serves every Python version (3.11 here,
3.12 on the GPU machine) and a tree can be carried to a machine without a
compiler. Every struct below mirrors client/kcache.h or schema/kc_schema.h
field by field; at import the library's KC_ABI_VERSION and its sizes of
those structs (kc_abi_version, kc_abi_sizeof) must match, or the import
fails with what differs. Memory the library returns is freed with its own
kc_free; libcurl's process set-up is its kc_global_init.

Where the library is looked for, first found wins:
  1. $KCACHE_LIB (a path to libkcache.so);
  2. beside this file (what `pip install ./python` installs);
  3. the repository's build trees (build/client/libkcache.so), for a
     checkout used with PYTHONPATH=python;
  4. the system's (ctypes.util.find_library("kcache")).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    Structure,
    c_char,
    c_char_p,
    c_double,
    c_int,
    c_long,
    c_size_t,
    c_uint64,
    c_void_p,
)
from typing import Any, Optional, Tuple

HEX_LEN = 64
MAX_DIMS = 16
MAX_TOOLS = 32
NAME_MAX = 32
TOOL_VALUE_MAX = 128
ARCH_MAX = 15
ERRBUF_SIZE = 512
LEASE_TOKEN_MAX = 128
LEASE_HOLDER_MAX = 128
WARM_N_STATUS = 6


class Dim(Structure):
    _fields_ = [("name", c_char * (NAME_MAX + 1)), ("value", c_uint64)]


class Tool(Structure):
    _fields_ = [
        ("name", c_char * (NAME_MAX + 1)),
        ("value", c_char * (TOOL_VALUE_MAX + 1)),
    ]


class Bucket(Structure):
    _fields_ = [("n", c_size_t), ("dims", Dim * MAX_DIMS)]


class KeyFields(Structure):
    _fields_ = [
        ("model", c_char * (HEX_LEN + 1)),
        ("build", c_char * (HEX_LEN + 1)),
        ("arch", c_char * (ARCH_MAX + 1)),
        ("bucket", Bucket),
        ("n_tools", c_size_t),
        ("tools", Tool * MAX_TOOLS),
    ]


class ClientOpts(Structure):
    _fields_ = [
        ("url", c_char_p),
        ("token", c_char_p),
        ("cacert", c_char_p),
        ("cache_dir", c_char_p),
        ("connect_timeout_ms", c_long),
        ("timeout_ms", c_long),
        ("low_speed_bps", c_long),
        ("low_speed_s", c_long),
        ("parallel", c_int),
        ("holder", c_char_p),
        ("allow_plaintext", c_int),
        ("trust_cache_dir", c_int),
    ]


class WarmOpts(Structure):
    _fields_ = [
        ("archs", POINTER(c_char_p)),
        ("n_archs", c_size_t),
        ("no_build", c_int),
        ("no_upload", c_int),
        ("deadline_s", c_double),
        ("out_dir", c_char_p),
        ("lease_ttl_s", c_int),
        ("poll_s", c_double),
        ("build_jobs", c_int),
        ("lease_wait_s", c_double),
        ("device_arch", c_char_p),
        ("no_compat", c_int),
        ("prefer_build", c_int),
        ("progress", c_void_p),
        ("progress_arg", c_void_p),
    ]


class WarmReport(Structure):
    # items is owned by the report (kc_warm_report_free); Python reads the
    # report only through kc_warm_report_json.
    _fields_ = [
        ("model", c_char * (HEX_LEN + 1)),
        ("n_items", c_size_t),
        ("items", c_void_p),
        ("counts", c_size_t * WARM_N_STATUS),
        ("bytes", c_uint64),
        ("bytes_fetched", c_uint64),
        ("seconds", c_double),
        ("server_down", c_int),
        ("warning", c_char * ERRBUF_SIZE),
        ("refused", c_int),
        ("refused_why", c_char * ERRBUF_SIZE),
    ]


def _candidates() -> list:
    here = os.path.dirname(os.path.abspath(__file__))
    out = []
    env = os.environ.get("KCACHE_LIB")
    if env:
        out.append(env)
    out.append(os.path.join(here, "libkcache.so"))
    root = os.path.dirname(os.path.dirname(here))
    for b in ("build", "build-san"):
        out.append(os.path.join(root, b, "client", "libkcache.so"))
    found = ctypes.util.find_library("kcache")
    if found:
        out.append(found)
    return out


def _load() -> ctypes.CDLL:
    tried = []
    for path in _candidates():
        if os.path.sep in path and not os.path.exists(path):
            tried.append(path + " (absent)")
            continue
        try:
            return ctypes.CDLL(path)
        except OSError as e:
            tried.append("%s (%s)" % (path, e))
    raise ImportError(
        "kcache: libkcache.so not found; set KCACHE_LIB or "
        "pip install ./python. Tried: " + "; ".join(tried)
    )


lib = _load()
LIB_PATH: str = lib._name


def _raises(result: int, func: Any, args: Tuple[Any, ...]) -> int:
    """ctypes errcheck of a function that returns a kc_err and takes its
    error buffer last: KC_OK passes, anything else raises the kcache.Error
    of that code with the sentence the library wrote."""
    if result != 0:
        from .errors import make_error

        buf = args[-1] if getattr(func, "kc_errbuf", False) else None
        text = buf.value.decode("utf-8", "replace") if buf is not None else ""
        raise make_error(result, text)
    return result


def _decl(
    name: str, restype, *argtypes, raises: bool = False, errbuf: bool = True
) -> None:
    """Declares lib.<name>. raises: a kc_err result other than KC_OK raises
    (errbuf: the last argument is the error buffer whose sentence goes in
    the exception); without it the caller reads the code itself."""
    f = getattr(lib, name)
    f.restype = restype
    f.argtypes = list(argtypes)
    if raises:
        f.errcheck = _raises
        f.kc_errbuf = errbuf


_ERRBUF = c_char_p  # char err[KC_ERRBUF_SIZE], a ctypes buffer passed in
_decl("kc_strerror", c_char_p, c_int)
_decl("kc_err_code", c_char_p, c_int)
_decl("kc_err_name", c_char_p, c_int)
_decl(
    "kc_client_new",
    c_int,
    POINTER(ClientOpts),
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl("kc_client_free", None, c_void_p)
_decl("kc_client_cache_dir", c_char_p, c_void_p)
_decl("kc_client_has_server", c_int, c_void_p)
_decl(
    "kc_client_pull",
    c_int,
    c_void_p,
    c_char_p,
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl("kc_client_push", c_int, c_void_p, c_void_p, _ERRBUF, raises=True)
_decl(
    "kc_client_bundle_get",
    c_int,
    c_void_p,
    c_char_p,
    POINTER(c_void_p),
    _ERRBUF,
)
_decl(
    "kc_client_lookup",
    c_int,
    c_void_p,
    POINTER(c_char_p),
    c_size_t,
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_client_pull_many",
    c_int,
    c_void_p,
    POINTER(c_char_p),
    c_size_t,
    POINTER(c_void_p),
    _ERRBUF,
)
_decl(
    "kc_client_lease_take",
    c_int,
    c_void_p,
    c_char_p,
    c_int,
    POINTER(c_int),
    c_char_p,
    POINTER(c_int),
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_client_lease_release",
    c_int,
    c_void_p,
    c_char_p,
    c_char_p,
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_client_stats", c_int, c_void_p, POINTER(c_void_p), _ERRBUF, raises=True
)
_decl(
    "kc_cache_bundle_get",
    c_int,
    c_void_p,
    c_char_p,
    POINTER(c_void_p),
    _ERRBUF,
)
_decl(
    "kc_materialize", c_int, c_void_p, c_void_p, c_char_p, _ERRBUF, raises=True
)
_decl(
    "kc_bundle_file_bytes",
    c_int,
    c_void_p,
    c_void_p,
    c_char_p,
    POINTER(c_void_p),
    POINTER(c_size_t),
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_bundle_from_dir",
    c_int,
    c_void_p,
    c_char_p,
    c_char_p,
    POINTER(KeyFields),
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_warmup_load", c_int, c_char_p, POINTER(c_void_p), _ERRBUF, raises=True
)
_decl(
    "kc_warmup_parse",
    c_int,
    c_char_p,
    c_size_t,
    c_char_p,
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl("kc_warmup_free", None, c_void_p)
_decl(
    "kc_warm",
    c_int,
    c_void_p,
    c_void_p,
    POINTER(WarmOpts),
    POINTER(WarmReport),
    _ERRBUF,
)
_decl(
    "kc_warm_report_json",
    c_int,
    POINTER(WarmReport),
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl("kc_warm_report_free", None, POINTER(WarmReport))
_decl(
    "kc_key_fields_parse",
    c_int,
    c_char_p,
    c_size_t,
    POINTER(KeyFields),
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_key_compute", c_int, POINTER(KeyFields), c_char_p, _ERRBUF, raises=True
)
_decl(
    "kc_key_canonical",
    c_int,
    POINTER(KeyFields),
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_manifest_parse",
    c_int,
    c_char_p,
    c_size_t,
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_manifest_to_json",
    c_int,
    c_void_p,
    POINTER(c_void_p),
    _ERRBUF,
    raises=True,
)
_decl("kc_manifest_free", None, c_void_p)
_decl(
    "kc_model_hash",
    c_int,
    POINTER(c_char_p),
    c_size_t,
    c_char_p,
    _ERRBUF,
    raises=True,
)
_decl(
    "kc_sha256_hex",
    c_int,
    c_char_p,
    c_size_t,
    c_char_p,
    raises=True,
    errbuf=False,
)
_decl("kc_arch_valid", c_int, c_char_p)

_decl("kc_abi_version", c_int)
_decl("kc_abi_sizeof", c_size_t, c_char_p)
_decl("kc_global_init", c_int, _ERRBUF)
_decl("kc_free", None, c_void_p)

# The structs above mirror the C ones field by field: a library of another
# layout would be read and written wrongly, so it is refused at import.
ABI_VERSION = 2
_MIRRORS = {
    "kc_dim": Dim,
    "kc_tool": Tool,
    "kc_bucket": Bucket,
    "kc_key_fields": KeyFields,
    "kc_client_opts": ClientOpts,
    "kc_warm_opts": WarmOpts,
    "kc_warm_report": WarmReport,
}


def _check_abi() -> None:
    have = lib.kc_abi_version()
    bad = [
        "%s: %d bytes here, %d in the library"
        % (n, ctypes.sizeof(t), lib.kc_abi_sizeof(n.encode()))
        for n, t in _MIRRORS.items()
        if ctypes.sizeof(t) != lib.kc_abi_sizeof(n.encode())
    ]
    if have != ABI_VERSION or bad:
        raise ImportError(
            "kcache: %s has ABI %d, this package wants %d%s; "
            "reinstall the package (pip install ./python)"
            % (
                LIB_PATH,
                have,
                ABI_VERSION,
                " (" + "; ".join(bad) + ")" if bad else "",
            )
        )


_check_abi()


def take_string(p: c_void_p) -> str:
    """A malloc'd NUL-terminated string from the library, copied and freed."""
    if not p.value:
        return ""
    try:
        return ctypes.string_at(p.value).decode("utf-8", "replace")
    finally:
        lib.kc_free(p.value)


def take_bytes(p: c_void_p, n: int) -> bytes:
    """A malloc'd buffer of n bytes from the library, copied and freed."""
    if not p.value:
        return b""
    try:
        return ctypes.string_at(p.value, n)
    finally:
        lib.kc_free(p.value)


def curl_init() -> None:
    """libcurl's process-wide set-up, which libkcache leaves to its host:
    kc_global_init does it once, whoever asks first."""
    lib.kc_global_init(None)


def errbuf() -> ctypes.Array:
    return ctypes.create_string_buffer(ERRBUF_SIZE)


def b(s: Optional[str]) -> Optional[bytes]:
    return None if s is None else s.encode("utf-8")
