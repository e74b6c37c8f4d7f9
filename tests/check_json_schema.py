#!/usr/bin/env python3
"""check_json_schema.py: the JSON Schema side of the schema/ examples.

Validates tests/schema_examples/{bundle,warmup}/{good,bad}/*.json against
schema/{bundle,warmup}.schema.json with python3-jsonschema: every good example
must pass and every bad one fail, exactly as test_schema (the C side) expects.
bad_c_only/ holds cases only the C code can reject (key == hash of fields,
unique paths, ...): they must PASS the JSON Schema, or they belong in bad/.

The "key" of a good bundle example is computed outside the C code, as
sha256(json.dumps({arch, bucket, build, model, toolchain, "v": 1},
sort_keys=True, separators=(",", ":"))).

Usage: check_json_schema.py SCHEMA_DIR EXAMPLES_DIR
Exit: 0 agree, 1 disagree, 77 python3-jsonschema missing (ctest: skipped;
with CI=true a failure instead).
"""

import importlib.metadata
import json
import os
import sys

import kcharness  # tests/, the script's directory

jsonschema = kcharness.need("jsonschema", "python3-jsonschema")

# $defs that both schema files carry and must keep identical.
SHARED_DEFS = ("hex64", "arch", "bucket", "toolchain", "ident")


def load(path):
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def examples(folder):
    names = sorted(n for n in os.listdir(folder) if n.endswith(".json"))
    if not names:
        raise SystemExit("%s: no examples" % folder)
    return [os.path.join(folder, n) for n in names]


def first_error(validator, doc):
    errors = sorted(validator.iter_errors(doc), key=lambda e: list(e.path))
    return errors[0] if errors else None


def where(err):
    return "/".join(str(p) for p in err.path) or "(root)"


def check_kind(kind, schema, examples_dir):
    """Returns the number of disagreements for one manifest kind."""
    jsonschema.Draft202012Validator.check_schema(schema)
    validator = jsonschema.Draft202012Validator(schema)
    failures = 0
    expect_valid = {"good": True, "bad": False, "bad_c_only": True}
    for which, want_valid in expect_valid.items():
        for path in examples(os.path.join(examples_dir, kind, which)):
            err = first_error(validator, load(path))
            rel = os.path.relpath(path, examples_dir)
            if (err is None) == want_valid:
                note = (
                    ""
                    if err is None
                    else ": %s: %s" % (where(err), err.message)
                )
                print("ok   %s%s" % (rel, note[:160]))
                continue
            failures += 1
            if err is None:
                print("FAIL %s: the JSON Schema accepts it" % rel)
            else:
                print("FAIL %s: %s: %s" % (rel, where(err), err.message[:200]))
    return failures


def check_shared_defs(bundle, warmup):
    failures = 0
    for name in SHARED_DEFS:
        if bundle["$defs"].get(name) != warmup["$defs"].get(name):
            print("FAIL $defs/%s differs between the two schema files" % name)
            failures += 1
    return failures


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    schema_dir, examples_dir = argv[1], argv[2]
    schemas = {
        k: load(os.path.join(schema_dir, k + ".schema.json"))
        for k in ("bundle", "warmup")
    }
    failures = check_shared_defs(schemas["bundle"], schemas["warmup"])
    for kind, schema in schemas.items():
        failures += check_kind(kind, schema, examples_dir)
    print(
        "%s (jsonschema %s)"
        % (
            "FAILED: %d disagreement(s)" % failures
            if failures
            else "all examples agree",
            importlib.metadata.version("jsonschema"),
        )
    )
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
