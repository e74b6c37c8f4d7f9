#!/usr/bin/env python3
"""check_layers.py: the include rule of kcache's C parts, checked.

Each part (a folder) may include its own headers and the public headers of
the parts below it, and nothing else: the server's two front ends (http/,
resp/) stand side by side on the core (server/), which knows neither; no
part above the store sees store_internal.h or the tier's headers. CMake's
include directories cannot say all of this (a quoted include is looked up
beside the including file first, and "../" reaches anywhere), so this
script reads every #include "..." of schema/, gpu/, store/, client/ and
server/ and fails on one the table below does not allow: a path ("a/b.h",
"../b.h"), another part's private header, or a part above.

Usage: scripts/check_layers.py [ROOT]   (exit 1 with a line per violation)
       scripts/check_layers.py --self-test
"""

import os
import re
import sys
import tempfile

# part: (folder, public headers, parts below it that it may use)
PARTS = {
    "schema": ("schema", ["kc_schema.h", "kc_error.h"], []),
    "gpu": ("gpu", ["kc_gpu.h"], ["schema"]),
    "store": ("store", ["kc_store.h"], ["schema"]),
    "client": ("client", ["kcache.h"], ["schema", "gpu"]),
    "core": ("server", ["kcd.h"], ["store", "schema"]),
    "http": ("server/http", [], ["core", "store", "schema"]),
    "resp": ("server/resp", [], ["core", "store", "schema"]),
}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.M)


def part_of(rel):
    """The part a file belongs to: the longest folder that holds it."""
    best = None
    for name, (folder, _, _) in PARTS.items():
        if rel.startswith(folder + "/"):
            if best is None or len(folder) > len(PARTS[best][0]):
                best = name
    return best


def own_headers(root, name):
    """Headers in the part's folder and its subfolders, less those of a
    part nested in it (server/ holds http/ and resp/)."""
    folder = PARTS[name][0]
    out = set()
    for d, _, files in os.walk(os.path.join(root, folder)):
        for f in files:
            rel = os.path.relpath(os.path.join(d, f), root)
            if f.endswith(".h") and part_of(rel) == name:
                out.add(f)
    return out


def allowed(root, name):
    ok = own_headers(root, name)
    for dep in PARTS[name][2]:
        ok.update(PARTS[dep][1])
    return ok


def check(root):
    """The violations under root, one line each."""
    bad = []
    allow = {name: allowed(root, name) for name in PARTS}
    for name, (folder, _, _) in PARTS.items():
        for d, _, files in os.walk(os.path.join(root, folder)):
            for f in sorted(files):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(d, f)
                rel = os.path.relpath(path, root)
                if part_of(rel) != name:
                    continue
                with open(path, encoding="utf-8", errors="replace") as fh:
                    text = fh.read()
                for m in INCLUDE.finditer(text):
                    inc = m.group(1)
                    line = text.count("\n", 0, m.start()) + 1
                    if "/" in inc:
                        why = "a path (each part's own folder is on its"
                        why += " include path; name the header alone)"
                    elif inc not in allow[name]:
                        why = "not %s's own header nor a public one of %s" % (
                            name,
                            ", ".join(PARTS[name][2]) or "any part",
                        )
                    else:
                        continue
                    bad.append(
                        '%s:%d: #include "%s": %s' % (rel, line, inc, why)
                    )
    return bad


def self_test():
    """The check must refuse what the rule forbids, and pass what it allows."""
    cases = [
        ("server/resp/x.c", '#include "http.h"\n', True),
        ("server/resp/x.c", '#include "http/http.h"\n', True),
        ("server/metrics.c", '#include "resp.h"\n', True),
        ("server/x.c", '#include "store_internal.h"\n', True),
        ("server/http/x.c", '#include "../resp/resp.h"\n', True),
        ("store/x.c", '#include "kcd.h"\n', True),
        ("server/http/x.c", '#include "http.h"\n#include "kcd.h"\n', False),
        ("store/tier/x.c", '#include "store_internal.h"\n', False),
    ]
    headers = [
        "schema/kc_schema.h",
        "schema/kc_error.h",
        "store/kc_store.h",
        "store/store_internal.h",
        "server/kcd.h",
        "server/http/http.h",
        "server/resp/resp.h",
    ]
    failed = 0
    for path, text, must_fail in cases:
        with tempfile.TemporaryDirectory() as root:
            for h in headers + [path]:
                p = os.path.join(root, h)
                os.makedirs(os.path.dirname(p), exist_ok=True)
                with open(p, "w") as fh:
                    fh.write(text if h == path else "")
            got = check(root)
            if bool(got) != must_fail:
                failed += 1
                print(
                    "self-test: %s with %r: %s" % (path, text, got or "passed")
                )
    return failed


def main(argv):
    if argv[1:] == ["--self-test"]:
        return 1 if self_test() else 0
    here = os.path.dirname(os.path.abspath(__file__))
    root = argv[1] if len(argv) > 1 else os.path.dirname(here)
    bad = check(root)
    for line in bad:
        print(line)
    if bad:
        print("check_layers.py: %d includes break the layering" % len(bad))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
