#!/usr/bin/env python3
"""test_deploy.py: static checks of deploy/ (systemd unit, env file, Dockerfile,
Kubernetes manifests, CI workflow, OPERATIONS.md). python3 stdlib + python3-yaml.

Usage: test_deploy.py [--root REPO] [unittest args]
"""

import os
import re
import shlex
import sys
import unittest

try:
    import yaml
except ImportError:  # a clear failure, not a skip: the tests need it
    sys.exit(
        "test_deploy.py: python3-yaml is missing (apt-get install python3-yaml)"
    )

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
ARCH_RE = re.compile(r"^(sm|compute)_[0-9]{2,3}[af]?$")
# Every kcached flag has a KCACHED_* variable; server/config.c is the truth,
# this list the fallback while it is not in the tree.
KCACHED_VARS = {
    "KCACHED_LISTEN",
    "KCACHED_DATA_DIR",
    "KCACHED_MAX_BYTES",
    "KCACHED_MAX_BLOB_BYTES",
    "KCACHED_TOKENS",
    "KCACHED_THREADS",
    "KCACHED_LOG_FORMAT",
    "KCACHED_TLS_CERT",
    "KCACHED_TLS_KEY",
    "KCACHED_ALLOW_PLAINTEXT",
    "KCACHED_PORT_FILE",
}


def path(*parts):
    return os.path.join(ROOT, *parts)


def read(*parts):
    with open(path(*parts), encoding="utf-8") as f:
        return f.read()


def kcached_vars():
    try:
        found = set(
            re.findall(r'"(KCACHED_[A-Z0-9_]+)"', read("server", "config.c"))
        )
    except OSError:
        found = set()
    return found or KCACHED_VARS


def all_kcached_env(doc_texts):
    """KCACHED_* names used as variables (VAR= or name: VAR) in the given texts."""
    names = set()
    for t in doc_texts:
        names |= set(
            re.findall(r"\b(KCACHED_[A-Z0-9_]+)(?==|,?\s*value:|})", t)
        )
    return names


def examples_present():
    return os.path.isdir(path("deploy", "examples", "demo-mlp"))


# ---------------------------------------------------------------- systemd


def parse_unit(text):
    """{section: [(key, value), ...]}; keeps repeated keys in order."""
    out, section = {}, None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if line.startswith("["):
            section = line.strip("[]")
            out.setdefault(section, [])
            continue
        key, sep, value = line.partition("=")
        assert sep and section, "bad unit line: %r" % raw
        out[section].append((key.strip(), value.strip()))
    return out


class SystemdUnit(unittest.TestCase):
    def setUp(self):
        self.unit = parse_unit(read("deploy", "systemd", "kcached.service"))
        self.svc = self.unit["Service"]

    def values(self, key):
        return [v for k, v in self.svc if k == key]

    def value(self, key):
        vals = self.values(key)
        self.assertTrue(vals, "kcached.service lacks %s=" % key)
        return vals[-1]

    def test_sections(self):
        self.assertEqual(set(self.unit), {"Unit", "Service", "Install"})
        self.assertIn(("WantedBy", "multi-user.target"), self.unit["Install"])

    def test_notify(self):
        self.assertEqual(self.value("Type"), "notify")
        self.assertEqual(self.value("NotifyAccess"), "main")
        self.assertIn("-HUP", self.value("ExecReload"))
        self.assertIn("$MAINPID", self.value("ExecReload"))
        self.assertTrue(
            self.value("ExecStart").split()[0].endswith("/kcached")
        )
        self.assertRegex(self.value("TimeoutStopSec"), r"^\d+s?$")

    def test_hardening(self):
        want = {
            "DynamicUser": "yes",
            "StateDirectory": "kcache",
            "ProtectSystem": "strict",
            "ProtectHome": "yes",
            "PrivateTmp": "yes",
            "PrivateDevices": "yes",
            "NoNewPrivileges": "yes",
            "MemoryDenyWriteExecute": "yes",
            "LockPersonality": "yes",
            "CapabilityBoundingSet": "",
            "RestrictNamespaces": "yes",
            "SystemCallArchitectures": "native",
        }
        for key, val in want.items():
            self.assertEqual(self.value(key), val, key)
        self.assertEqual(
            set(self.value("RestrictAddressFamilies").split()),
            {"AF_INET", "AF_INET6", "AF_UNIX"},
        )
        self.assertIn("@system-service", self.values("SystemCallFilter"))
        self.assertGreaterEqual(int(self.value("LimitNOFILE")), 4096)

    def test_environment(self):
        files = self.values("EnvironmentFile")
        self.assertEqual(files, ["-/etc/kcache/kcached.env"])
        env = dict(v.split("=", 1) for v in self.values("Environment"))
        # the data dir must be the writable StateDirectory under ProtectSystem=strict
        self.assertEqual(env.get("KCACHED_DATA_DIR"), "%S/kcache")
        self.assertTrue(env.get("KCACHED_LISTEN", "").startswith("127.0.0.1:"))

    def test_env_file(self):
        text = read("deploy", "systemd", "kcached.env")
        active = set()
        for raw in text.splitlines():
            line = raw.strip()
            if not line:
                continue
            commented = line.startswith("#")
            body = line.lstrip("#").strip()
            m = re.match(r"^([A-Z_][A-Z0-9_]*)=(\S*)$", body)
            if not commented:
                self.assertTrue(m, "not VAR=value: %r" % raw)
            if m and m.group(1).startswith("KCACHED_"):
                self.assertIn(m.group(1), kcached_vars(), raw)
                if not commented:
                    active.add(m.group(1))
        self.assertIn("KCACHED_LISTEN", active)
        self.assertIn("KCACHED_TOKENS", text)
        self.assertIn("LoadCredential=", text)


# ---------------------------------------------------------------- Dockerfile


def dockerfile_instructions(text):
    """[(INSTRUCTION, args)] with continuations joined and comments dropped."""
    out, cur = [], ""
    for raw in text.splitlines():
        line = raw.rstrip()
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if cur and line.lstrip().startswith("#"):
            continue
        if line.endswith("\\"):
            cur += line[:-1] + " "
            continue
        cur += line
        word, _, rest = cur.strip().partition(" ")
        out.append((word.upper(), rest.strip()))
        cur = ""
    return out


class Dockerfile(unittest.TestCase):
    @staticmethod
    def stages_of(text):
        """[{"from": args, "ins": [(INSTRUCTION, args)]}] per FROM."""
        stages, stage = [], None
        for word, args in dockerfile_instructions(text):
            if word == "FROM":
                stage = {"from": args, "ins": []}
                stages.append(stage)
            elif stage is not None:
                stage["ins"].append((word, args))
        return stages

    def setUp(self):
        self.stages = self.stages_of(read("deploy", "container", "Dockerfile"))

    def args(self, stage, word):
        return [a for w, a in stage["ins"] if w == word]

    def test_stages(self):
        self.assertEqual(len(self.stages), 2)
        for st in self.stages:
            self.assertTrue(
                st["from"].startswith("debian:bookworm-slim"), st["from"]
            )
        self.assertRegex(self.stages[0]["from"], r"\bAS\s+build$")

    def test_build_stage(self):
        run = " ".join(self.args(self.stages[0], "RUN"))
        for pkg in (
            "liblmdb-dev",
            "libmicrohttpd-dev",
            "libcurl4-openssl-dev",
            "libssl-dev",
            "libjansson-dev",
            "cmake",
            "gcc",
            "pkg-config",
        ):
            self.assertIn(pkg, run.split(), pkg)
        self.assertIn("-DKCACHE_TESTS=OFF", run)
        self.assertIn("cmake --install", run)
        self.assertIn("-DCMAKE_INSTALL_PREFIX=/opt/kcache", run)

    def test_copy_sources_exist(self):
        copied = set()
        for st in self.stages:
            for word, args in st["ins"]:
                if word not in ("COPY", "ADD"):
                    continue
                parts = [
                    p for p in shlex.split(args) if not p.startswith("--")
                ]
                if any(p.startswith("--from") for p in shlex.split(args)):
                    self.assertEqual(parts, ["/opt/kcache", "/opt/kcache"])
                    continue
                for src in parts[:-1]:
                    self.assertTrue(
                        os.path.exists(path(src)),
                        "COPY source missing: " + src,
                    )
                    copied.add(src.rstrip("/"))
        # every directory the top-level build descends into must be copied
        top = read("CMakeLists.txt")
        for sub in re.findall(r"add_subdirectory\(\s*([\w./-]+)", top):
            if sub != "tests":
                self.assertIn(
                    sub,
                    copied,
                    "the build needs %s/ but the Dockerfile "
                    "does not COPY it" % sub,
                )
        for inc in re.findall(r"include\(\s*([\w./-]+\.cmake)", top):
            self.assertTrue(
                any(inc == c or inc.startswith(c + "/") for c in copied), inc
            )
        self.assertIn("CMakeLists.txt", copied)
        # and every file a copied module reaches outside itself
        for sub in copied:
            cm = path(sub, "CMakeLists.txt")
            if not os.path.isfile(cm):
                continue
            with open(cm, encoding="utf-8") as f:
                for ref in re.findall(
                    r"\$\{(?:PROJECT|CMAKE)_SOURCE_DIR\}/([\w.-]+)", f.read()
                ):
                    self.assertIn(
                        ref,
                        copied,
                        "%s/CMakeLists.txt uses %s/, not copied" % (sub, ref),
                    )

    def test_runtime_stage(self):
        rt = self.stages[1]
        run = " ".join(self.args(rt, "RUN"))
        for pkg in (
            "liblmdb0",
            "libmicrohttpd12",
            "libcurl4",
            "libssl3",
            "libjansson4",
            "curl",
        ):
            self.assertIn(pkg, run.split(), pkg)
        self.assertNotRegex(
            run, r"-dev\b", "runtime stage installs a -dev package"
        )
        user = self.args(rt, "USER")
        self.assertTrue(user, "no USER")
        self.assertNotIn(user[-1].split(":")[0], ("0", "root"))
        exposed = " ".join(self.args(rt, "EXPOSE")).split()
        self.assertEqual(
            sorted(exposed), ["6379", "8080"], "HTTP API and RESP ports"
        )
        self.assertTrue(self.args(rt, "VOLUME"))
        self.assertIn("/var/lib/kcache", self.args(rt, "VOLUME")[0])
        env = " ".join(self.args(rt, "ENV"))
        self.assertIn("KCACHED_LISTEN=0.0.0.0:8080", env)
        self.assertIn("KCACHED_DATA_DIR=/var/lib/kcache", env)
        hc = " ".join(self.args(rt, "HEALTHCHECK"))
        self.assertIn("/healthz", hc)
        self.assertIn("curl -fsS", hc)
        self.assertTrue(
            any("kcached" in e for e in self.args(rt, "ENTRYPOINT"))
        )


# ---------------------------------------------------------------- build deps

# find_package() names of the build and the Debian package that provides each;
# pkg-config modules need no table: dpkg tells which package owns the .pc file.
FIND_PACKAGE_DEBS = {
    "PkgConfig": "pkg-config",
    "Threads": "libc6-dev",
    "OpenSSL": "libssl-dev",
}
PKG_WORDS = {
    "REQUIRED",
    "QUIET",
    "IMPORTED_TARGET",
    "GLOBAL",
    "NO_CMAKE_PATH",
    "NO_CMAKE_ENVIRONMENT_PATH",
}


def cmake_requirements():
    """(pkg-config modules, find_package names) of the build the container and
    the CI example run: every CMake file but the tests' (KCACHE_TESTS=OFF)."""
    mods, found = set(), set()
    for dirpath, dirs, files in os.walk(ROOT):
        rel = os.path.relpath(dirpath, ROOT)
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith((".", "build"))
            and not (rel == "." and d in ("tests", "python"))
        ]
        for f in files:
            if f != "CMakeLists.txt" and not f.endswith(".cmake"):
                continue
            text = re.sub(r"#[^\n]*", "", read(rel, f))
            for m in re.finditer(r"pkg_check_modules\(([^)]*)\)", text):
                mods |= {
                    w for w in m.group(1).split()[1:] if w not in PKG_WORDS
                }
            found |= set(re.findall(r"find_package\(\s*(\w+)", text))
    return mods, found


def run_out(argv):
    import subprocess

    return subprocess.run(
        argv, capture_output=True, text=True, check=True
    ).stdout


def deb_of_module(mod):
    """The Debian package that owns pkg-config module mod's .pc file here."""
    pcdir = run_out(["pkg-config", "--variable=pcfiledir", mod]).strip()
    owner = run_out(["dpkg", "-S", os.path.join(pcdir, mod + ".pc")])
    return owner.split(":")[0].strip()


def runtime_debs(dev):
    """The library packages a -dev package depends on (libzstd-dev: libzstd1)."""
    deps = run_out(["dpkg-query", "-W", "-f=${Depends}", dev])
    return {
        d.strip().split()[0].split(":")[0]
        for d in re.split(r"[,|]", deps)
        if d.strip().startswith("lib")
        and not d.strip().split()[0].endswith("-dev")
    }


class BuildDeps(unittest.TestCase):
    """The container's and the CI example's package lists cover every
    pkg_check_modules and find_package of the build (they once lacked
    libzstd-dev and libexpat1-dev, and the container could not build)."""

    def setUp(self):
        import shutil

        if not (shutil.which("dpkg") and shutil.which("pkg-config")):
            if os.environ.get("CI") == "true":
                self.fail(
                    "dpkg and pkg-config are needed to map modules to packages"
                )
            self.skipTest("not a Debian host with pkg-config")
        mods, found = cmake_requirements()
        self.assertIn("libzstd", mods)  # the scan itself works
        unknown = found - set(FIND_PACKAGE_DEBS)
        self.assertFalse(
            unknown,
            "add these find_package names to FIND_PACKAGE_DEBS: %s"
            % sorted(unknown),
        )
        self.devs = {deb_of_module(m) for m in mods}
        self.devs |= {FIND_PACKAGE_DEBS[f] for f in found}
        self.devs |= {"cmake", "gcc", "make"}

    def test_container_build_stage(self):
        stages = Dockerfile.stages_of(
            read("deploy", "container", "Dockerfile")
        )
        words = " ".join(a for w, a in stages[0]["ins"] if w == "RUN").split()
        self.assertFalse(
            self.devs - set(words),
            "the Dockerfile's build stage lacks %s"
            % sorted(self.devs - set(words)),
        )

    def test_container_runtime_stage(self):
        stages = Dockerfile.stages_of(
            read("deploy", "container", "Dockerfile")
        )
        words = set(
            " ".join(a for w, a in stages[1]["ins"] if w == "RUN").split()
        )
        for dev in sorted(self.devs):
            libs = (
                runtime_debs(dev)
                if dev.endswith("-dev") and dev != "libc6-dev"
                else set()
            )
            if libs:
                self.assertTrue(
                    libs & words,
                    "the runtime stage lacks %s (for %s)"
                    % (" or ".join(sorted(libs)), dev),
                )

    def test_torch_service_stages(self):
        """`pip install ./python` configures the whole project: the image's
        build stage needs every -dev package; its runtime stage the
        libraries libkcache.so links (not libmicrohttpd's or LMDB's)."""
        stages = Dockerfile.stages_of(
            read("deploy", "examples", "torch-service", "Dockerfile")
        )
        words = " ".join(a for w, a in stages[0]["ins"] if w == "RUN").split()
        self.assertFalse(
            self.devs - set(words),
            "its build stage lacks %s" % sorted(self.devs - set(words)),
        )
        rt = set(
            " ".join(a for w, a in stages[1]["ins"] if w == "RUN").split()
        )
        for dev in (
            "libcurl4-openssl-dev",
            "libssl-dev",
            "libjansson-dev",
            "libzstd-dev",
        ):
            self.assertTrue(
                runtime_debs(dev) & rt,
                "its runtime stage lacks the library of %s" % dev,
            )
        for pkg in (
            "python3",
            "g++",
            "python3-dev",
        ):  # Inductor's C++ on the CPU
            self.assertIn(pkg, rt)

    def test_ci_example(self):
        wf = yaml.safe_load(read("deploy", "ci", "warmup.yml"))
        for name, job in wf["jobs"].items():
            runs = [s.get("run", "") for s in job["steps"]]
            if not any(re.search(r"cmake -S", r) for r in runs):
                continue
            words = set(
                " ".join(r for r in runs if "apt-get install" in r).split()
            )
            self.assertFalse(
                self.devs - words,
                "job %s lacks %s" % (name, sorted(self.devs - words)),
            )


# ---------------------------------------------------------------- Kubernetes


def k8s_docs():
    out = []
    k8s = path("deploy", "k8s")
    for name in sorted(os.listdir(k8s)):
        if name.endswith((".yaml", ".yml")):
            with open(os.path.join(k8s, name), encoding="utf-8") as f:
                text = f.read()
            for doc in yaml.safe_load_all(text):
                if doc is not None:
                    out.append((name, text, doc))
    return out


def pod_spec(doc):
    if doc["kind"] in ("StatefulSet", "Deployment", "Job"):
        return doc["spec"]["template"]["spec"]
    return None


def created_by_command(kind, name, texts):
    """True if `kubectl create KIND ... NAME` appears in the given texts."""
    pat = re.compile(
        r"kubectl create %s\s+(generic\s+|tls\s+)?%s\b"
        % (kind, re.escape(name))
    )
    return any(pat.search(t) for t in texts)


class Kubernetes(unittest.TestCase):
    def setUp(self):
        self.docs = k8s_docs()
        self.ops = read("deploy", "OPERATIONS.md")
        self.by_kind = {}
        for name, text, doc in self.docs:
            self.by_kind.setdefault(doc["kind"], []).append((name, text, doc))

    def one(self, kind, name):
        found = [
            d
            for _, _, d in self.by_kind.get(kind, [])
            if d["metadata"]["name"] == name
        ]
        self.assertEqual(len(found), 1, "%s/%s" % (kind, name))
        return found[0]

    def test_parse_and_kinds(self):
        self.assertTrue(self.docs)
        for fname, _, doc in self.docs:
            for field in ("apiVersion", "kind", "metadata"):
                self.assertIn(field, doc, fname)
            self.assertTrue(doc["metadata"].get("name"), fname)
        for kind in ("StatefulSet", "Service", "Deployment", "Job"):
            self.assertIn(kind, self.by_kind)

    def test_pod_specs(self):
        """Volumes, images, resources, non-root, read-only root, references."""
        for fname, text, doc in self.docs:
            spec = pod_spec(doc)
            if spec is None:
                continue
            where = "%s %s/%s" % (fname, doc["kind"], doc["metadata"]["name"])
            vols = {v["name"]: v for v in spec.get("volumes", [])}
            claims = {
                c["metadata"]["name"]
                for c in doc["spec"].get("volumeClaimTemplates", [])
            }
            psc = spec.get("securityContext", {})
            self.assertEqual(
                psc.get("seccompProfile", {}).get("type"),
                "RuntimeDefault",
                where,
            )
            for c in spec.get("initContainers", []) + spec["containers"]:
                cw = "%s container %s" % (where, c["name"])
                self.assertTrue(c.get("image"), cw)
                res = c.get("resources", {})
                self.assertTrue(
                    res.get("requests") and res.get("limits"),
                    cw + " resources",
                )
                csc = c.get("securityContext", {})
                self.assertTrue(
                    psc.get("runAsNonRoot") or csc.get("runAsNonRoot"), cw
                )
                self.assertNotEqual(
                    psc.get("runAsUser", csc.get("runAsUser")), 0, cw
                )
                self.assertIs(csc.get("readOnlyRootFilesystem"), True, cw)
                self.assertIs(csc.get("allowPrivilegeEscalation"), False, cw)
                self.assertIn(
                    "ALL", csc.get("capabilities", {}).get("drop", []), cw
                )
                for m in c.get("volumeMounts", []):
                    self.assertTrue(
                        m["name"] in vols or m["name"] in claims,
                        "%s mounts unknown volume %s" % (cw, m["name"]),
                    )
                for e in c.get("env", []):
                    ref = e.get("valueFrom", {}).get("secretKeyRef")
                    if ref:
                        self.assert_exists("secret", ref["name"], text, cw)
            for v in vols.values():
                if "secret" in v:
                    self.assert_exists(
                        "secret", v["secret"]["secretName"], text, where
                    )
                if "configMap" in v:
                    self.assert_exists(
                        "configmap", v["configMap"]["name"], text, where
                    )
            used = {
                m["name"]
                for c in spec.get("initContainers", []) + spec["containers"]
                for m in c.get("volumeMounts", [])
            }
            self.assertEqual(
                set(vols) - used, set(), where + ": unused volumes"
            )

    def assert_exists(self, kind, name, text, where):
        defined = any(
            d["metadata"]["name"] == name
            for _, _, d in self.by_kind.get(
                {"secret": "Secret", "configmap": "ConfigMap"}[kind], []
            )
        )
        self.assertTrue(
            defined or created_by_command(kind, name, [text, self.ops]),
            "%s: %s %s is neither defined nor created by a documented "
            "kubectl command" % (where, kind, name),
        )

    def test_kcached(self):
        sts = self.one("StatefulSet", "kcached")
        spec = sts["spec"]
        pod = spec["template"]["spec"]
        labels = spec["template"]["metadata"]["labels"]
        self.assertEqual(
            spec["selector"]["matchLabels"].items() - labels.items(), set()
        )
        self.assertTrue(spec["volumeClaimTemplates"])
        claim = spec["volumeClaimTemplates"][0]
        self.assertIn("storage", claim["spec"]["resources"]["requests"])
        c = pod["containers"][0]
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        env = {e["name"]: e.get("value") for e in c["env"]}
        # the listen port is the container port
        self.assertIn(
            int(env["KCACHED_LISTEN"].rsplit(":", 1)[1]), ports.values()
        )
        for probe, want in (
            ("readinessProbe", "/readyz"),
            ("livenessProbe", "/healthz"),
        ):
            get = c[probe]["httpGet"]
            self.assertEqual(get["path"], want)
            self.assertTrue(
                get["port"] in ports or get["port"] in ports.values(), probe
            )
            # TLS on: the probes must speak it
            if env.get("KCACHED_TLS_CERT"):
                self.assertEqual(get.get("scheme"), "HTTPS", probe)
        # the data dir is on the claim; the token and TLS files are on Secret mounts
        mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
        self.assertEqual(
            mounts.get(env["KCACHED_DATA_DIR"]), claim["metadata"]["name"]
        )
        vols = {v["name"]: v for v in pod["volumes"]}
        for var in ("KCACHED_TOKENS", "KCACHED_TLS_CERT", "KCACHED_TLS_KEY"):
            d = os.path.dirname(env[var])
            self.assertIn(d, mounts, var)
            self.assertIn("secret", vols[mounts[d]], var)
        # non-loopback listen: kcached requires tokens, and TLS or plaintext opt-in
        self.assertTrue(
            env.get("KCACHED_TLS_CERT") or env.get("KCACHED_ALLOW_PLAINTEXT")
        )
        # Services: one headless (the StatefulSet's), one regular, both reach the port
        headless = self.one("Service", spec["serviceName"])
        self.assertEqual(headless["spec"].get("clusterIP"), "None")
        regular = [
            d
            for _, _, d in self.by_kind["Service"]
            if d["spec"].get("clusterIP") != "None"
            and d["spec"]["selector"].items() <= labels.items()
        ]
        self.assertEqual(len(regular), 1)
        for svc in (headless, regular[0]):
            self.assertLessEqual(
                svc["spec"]["selector"].items(), labels.items()
            )
            for p in svc["spec"]["ports"]:
                tp = p.get("targetPort", p["port"])
                self.assertTrue(
                    tp in ports or tp in ports.values(),
                    svc["metadata"]["name"],
                )

    def test_kcached_resp_port(self):
        """The Redis-protocol listener: a named container port, on both
        Services, and the settings kcached needs to start with it."""
        sts = self.one("StatefulSet", "kcached")
        spec = sts["spec"]
        c = spec["template"]["spec"]["containers"][0]
        env = {e["name"]: e.get("value") for e in c["env"]}
        listen = env.get("KCACHED_RESP_LISTEN")
        self.assertTrue(listen, "KCACHED_RESP_LISTEN not set")
        host, port = listen.rsplit(":", 1)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        self.assertEqual(ports.get("redis"), int(port))
        self.assertNotEqual(ports.get("redis"), ports.get("https"))
        # off loopback kcached refuses RESP without tokens, and without TLS
        # (a certificate) or the plaintext opt-in
        if not host.startswith("127."):
            self.assertTrue(env.get("KCACHED_TOKENS"))
            self.assertTrue(
                env.get("KCACHED_TLS_CERT")
                or env.get("KCACHED_ALLOW_PLAINTEXT") == "1"
            )
        self.assertIn(
            env.get("KCACHED_RESP_ANONYMOUS_ROLE", "none"),
            ("none", "read", "write"),
        )
        for svc in self.by_kind["Service"]:
            doc = svc[2]
            redis = [p for p in doc["spec"]["ports"] if p["name"] == "redis"]
            self.assertEqual(len(redis), 1, doc["metadata"]["name"])
            self.assertEqual(redis[0]["port"], 6379)
            self.assertIn(redis[0].get("targetPort"), ("redis", int(port)))
        # the NetworkPolicy that fences the RESP port names real ports
        for _, _, pol in self.by_kind.get("NetworkPolicy", []):
            self.assertLessEqual(
                pol["spec"]["podSelector"]["matchLabels"].items(),
                spec["template"]["metadata"]["labels"].items(),
            )
            for rule in pol["spec"]["ingress"]:
                for p in rule.get("ports", []):
                    self.assertTrue(
                        p["port"] in ports or p["port"] in ports.values(), p
                    )

    def test_network_policy_admits_the_scrape(self):
        """A pod annotated for Prometheus is scraped on that port: the
        NetworkPolicy that selects it must admit the port (by number or by
        its container port's name), or an enforcing CNI drops the scrape."""
        pols = [d for _, _, d in self.by_kind.get("NetworkPolicy", [])]
        self.assertTrue(pols)
        for fname, _, doc in self.docs:
            spec = pod_spec(doc)
            ann = (
                (
                    doc["spec"]
                    .get("template", {})
                    .get("metadata", {})
                    .get("annotations")
                    or {}
                )
                if spec
                else {}
            )
            if ann.get("prometheus.io/scrape") != "true":
                continue
            port = int(ann["prometheus.io/port"])
            labels = doc["spec"]["template"]["metadata"]["labels"]
            names = {
                p.get("name")
                for c in spec["containers"]
                for p in c.get("ports", [])
                if p["containerPort"] == port
            }
            for pol in pols:
                if (
                    not pol["spec"]["podSelector"]["matchLabels"].items()
                    <= labels.items()
                ):
                    continue
                admitted = {
                    p["port"]
                    for r in pol["spec"]["ingress"]
                    for p in r.get("ports", [])
                }
                self.assertTrue(
                    admitted & (names | {port}),
                    "%s: port %d (%s) not admitted "
                    "by NetworkPolicy %s"
                    % (fname, port, names, pol["metadata"]["name"]),
                )

    def warm_args(self, container):
        cmd = container.get("command", []) + container.get("args", [])
        self.assertEqual(cmd[:2], ["kcache", "warm"], container["name"])
        return cmd

    def manifest_mounted(self, pod, container, cmd):
        manifest = cmd[2]
        vols = {v["name"]: v for v in pod["volumes"]}
        for m in container["volumeMounts"]:
            if manifest.startswith(m["mountPath"].rstrip("/") + "/"):
                self.assertIn(
                    "configMap",
                    vols[m["name"]],
                    "manifest not from a ConfigMap",
                )
                rel = manifest[len(m["mountPath"].rstrip("/")) + 1 :]
                items = vols[m["name"]]["configMap"].get("items")
                if items:
                    self.assertIn(rel, [i["path"] for i in items])
                return
        self.fail("warmup manifest %s is on no mounted volume" % manifest)

    def client_env(self, container):
        env = {e["name"]: e for e in container["env"]}
        self.assertTrue(env["KCACHE_URL"]["value"].startswith("https://"))
        self.assertIn("secretKeyRef", env["KCACHE_TOKEN"]["valueFrom"])
        return env

    def test_inference(self):
        deps = self.by_kind["Deployment"]
        self.assertEqual(len(deps), 1)
        dep = deps[0][2]
        pod = dep["spec"]["template"]["spec"]
        self.assertEqual(len(pod["initContainers"]), 1)
        init = pod["initContainers"][0]
        cmd = self.warm_args(init)
        self.assertIn("--deadline", cmd)
        self.assertGreater(int(cmd[cmd.index("--deadline") + 1]), 0)
        self.assertNotIn(
            "--strict", cmd, "a cache outage must never block a rollout"
        )
        self.manifest_mounted(pod, init, cmd)
        self.client_env(init)
        # --out is on an emptyDir that the app container mounts too
        out = cmd[cmd.index("--out") + 1]
        vols = {v["name"]: v for v in pod["volumes"]}
        shared = [
            m
            for m in init["volumeMounts"]
            if out == m["mountPath"]
            or out.startswith(m["mountPath"].rstrip("/") + "/")
        ]
        self.assertEqual(len(shared), 1)
        self.assertIn("emptyDir", vols[shared[0]["name"]])
        app_mounts = {
            m["name"]
            for c in pod["containers"]
            for m in c.get("volumeMounts", [])
        }
        self.assertIn(shared[0]["name"], app_mounts)

    def test_prepopulate_job(self):
        jobs = self.by_kind["Job"]
        self.assertEqual(len(jobs), 1)
        job = jobs[0][2]
        pod = job["spec"]["template"]["spec"]
        self.assertIn(pod["restartPolicy"], ("Never", "OnFailure"))
        c = pod["containers"][0]
        cmd = self.warm_args(c)
        archs = cmd[cmd.index("--arch") + 1].split(",")
        self.assertGreaterEqual(len(archs), 2)
        for a in archs:
            self.assertRegex(a, ARCH_RE)
        self.assertIn("--deadline", cmd)
        self.manifest_mounted(pod, c, cmd)
        self.client_env(c)

    def test_configmap_sources_exist(self):
        if not examples_present():
            self.skipTest("deploy/examples/demo-mlp not in this tree yet")
        for fname, text, _ in self.docs:
            for src in re.findall(r"--from-file=[\w.-]+=(deploy/\S+)", text):
                self.assertTrue(
                    os.path.isfile(path(src)), "%s: %s" % (fname, src)
                )


# ---------------------------------------------------------------- CI workflow


class Workflow(unittest.TestCase):
    def setUp(self):
        self.text = read("deploy", "ci", "warmup.yml")
        self.wf = yaml.safe_load(self.text)

    def test_shape(self):
        # YAML 1.1 reads the key `on` as True
        on = self.wf.get("on", self.wf.get(True))
        self.assertTrue(on, "no triggers")
        self.assertIn("workflow_dispatch", on)
        self.assertEqual(self.wf.get("permissions"), {"contents": "read"})
        self.assertTrue(self.wf["jobs"])

    def steps(self):
        for name, job in self.wf["jobs"].items():
            self.assertTrue(job.get("runs-on"), name)
            for step in job["steps"]:
                self.assertTrue("run" in step or "uses" in step, step)
                yield job, step

    def test_builds_and_warms(self):
        runs = [s["run"] for _, s in self.steps() if "run" in s]
        allrun = "\n".join(runs)
        self.assertRegex(allrun, r"cmake -S \. -B \S+")
        self.assertIn("cmake --build", allrun)
        warm = [
            (j, r)
            for j, s in self.steps()
            for r in [s.get("run", "")]
            if re.search(r"\bkcache warm\b", r)
        ]
        self.assertTrue(warm)
        job, run = warm[0]
        self.assertNotIn(
            "--no-build", run.split("--arch")[0], "the first warm must build"
        )
        self.assertIn("--arch", run)
        self.assertIn("--deadline", run)
        # the archs: a matrix over valid names, or one valid comma list
        archs = job.get("strategy", {}).get("matrix", {}).get("arch")
        if archs:
            self.assertIn("matrix.arch", run)
        else:
            archs = (
                re.search(r"--arch[ =]\"?([\w,]+)", run).group(1).split(",")
            )
        self.assertGreaterEqual(len(archs), 2)
        for a in archs:
            self.assertRegex(a, ARCH_RE)
        # NVRTC without a GPU: a CUDA toolkit container on an ordinary runner
        self.assertRegex(
            str(job.get("container", "")), r"nvidia/cuda:[\w.-]*devel"
        )
        self.assertNotIn("gpu", str(job["runs-on"]).lower())

    def test_write_token_from_secrets(self):
        tokens = []
        for job in self.wf["jobs"].values():
            tokens += [
                v
                for k, v in (job.get("env") or {}).items()
                if k == "KCACHE_TOKEN"
            ]
        tokens += [
            v
            for k, v in (self.wf.get("env") or {}).items()
            if k == "KCACHE_TOKEN"
        ]
        self.assertTrue(tokens)
        for t in tokens:
            self.assertRegex(t, r"^\$\{\{\s*secrets\.\w+\s*\}\}$")

    def test_actions_pinned(self):
        for _, s in self.steps():
            if "uses" in s:
                self.assertRegex(s["uses"], r"^[\w.-]+/[\w.-]+@v?\d")

    def test_manifest_exists(self):
        if not examples_present():
            self.skipTest("deploy/examples/demo-mlp not in this tree yet")
        manifest = self.wf["env"]["MANIFEST"]
        self.assertTrue(os.path.isfile(path(manifest)), manifest)


# ---------------------------------------------------------------- all files


class KcachedVariables(unittest.TestCase):
    def test_every_variable_is_a_kcached_flag(self):
        texts = [
            read("deploy", "systemd", "kcached.service"),
            read("deploy", "systemd", "kcached.env"),
            read("deploy", "container", "Dockerfile"),
            read("deploy", "OPERATIONS.md"),
        ]
        for _, _, doc in k8s_docs():
            spec = pod_spec(doc)
            for c in (spec or {}).get("containers", []) + (spec or {}).get(
                "initContainers", []
            ):
                texts += ["%s=" % e["name"] for e in c.get("env", [])]
        used = all_kcached_env(texts)
        self.assertIn("KCACHED_LISTEN", used)
        self.assertEqual(used - kcached_vars(), set(), "not kcached variables")


# ---------------------------------------------------------------- OPERATIONS.md


class Operations(unittest.TestCase):
    def test_topics(self):
        text = read("deploy", "OPERATIONS.md")
        for needle in (
            "### Sizing",
            "--max-bytes",
            "kcached token",
            "role name sha256hex",
            "SIGHUP",
            "systemctl reload",
            "mdb_copy -c",
            "lmdb-utils",
            '"v":1',
            "write-once",
            "Rolling restart",
            "store_full",
            "5xx",
            "p99",
            "evict",
            "lease",
            "--deadline",
            "--strict",
            "### When kcached is down",
            "KCACHED_ALLOW_PLAINTEXT",
        ):
            self.assertTrue(needle in text, "OPERATIONS.md lacks %r" % needle)

    def test_files_it_names_exist(self):
        text = read("deploy", "OPERATIONS.md")
        for rel in re.findall(
            r"`((?:systemd|container|k8s|ci)/[\w./-]+)`", text
        ):
            self.assertTrue(os.path.exists(path("deploy", rel)), rel)


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--root":
        ROOT = os.path.abspath(sys.argv[2])
        del sys.argv[1:3]
    unittest.main(verbosity=2)
