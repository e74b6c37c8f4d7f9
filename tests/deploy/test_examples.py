#!/usr/bin/env python3
"""test_examples.py: the examples under deploy/ taken through what runs
here, as written, against deploy/k8s/kcached.yaml's kcached (its
StatefulSet's environment and Secrets: tokens, TLS on both ports; its
startup probe, and the Prometheus scrape its annotations ask for):

- the Kubernetes pods (deploy/k8s/inference.yaml's init container,
  prepopulate-job.yaml's job): each container's command and environment
  run with its volumes made as Kubernetes would (the ConfigMap from the
  `kubectl create configmap` recipe in the file's comment, the Secrets'
  CA and token, emptyDirs group-writable as fsGroup leaves them) and with
  its image's tools: no NVRTC in the kcache image, the NVRTC that
  Dockerfile.nvrtc's own pip command installs in kcache-nvrtc. The init
  container starts (exit 0) against an empty kcached, the job builds every
  bundle, then the init container fetches them all;
- deploy/ci/warmup.yml: its jobs' run steps (suggest, then warm and check
  one arch) with the NVRTC of its CUDA;
- the Dockerfiles: every apt-get install list resolves on this Debian 12
  (apt-get -s), every COPY source exists, torch-service's pins are the ones
  the tests run (scripts/pyenv.sh);
- deploy/examples/torch-service: entrypoint.py with deployment.yaml's
  environment and mounts (KCACHE_CACERT, ssl_ca_certs), twice: the second
  replica, with empty caches and a read token, hits what the first built.

Usage: test_examples.py --root REPO --kcached BIN --kcache BIN
                        [--venv VENV --lib libkcache.so]
Without --venv and --lib the torch-service test skips; without torch in
the venv too, but then it fails when CI=true.
"""

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.error
import urllib.request

import yaml

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
import test_deploy  # noqa: E402  (the Dockerfile parser)
from kcharness import free_port  # noqa: E402

A = None  # the command line
SRV = None  # the kcached of the module


def openssl(*args, cwd):
    subprocess.run(
        ["openssl"] + list(args),
        cwd=cwd,
        check=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def make_pki(d):
    """A CA and a server certificate naming kcached (the Service) and
    127.0.0.1, as cert-manager would issue kcached-tls."""
    ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ]
    openssl(
        "req",
        "-x509",
        *ec,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=kcache example CA",
        "-addext",
        "basicConstraints=critical,CA:TRUE",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=d,
    )
    openssl(
        "req",
        *ec,
        "-keyout",
        "tls.key",
        "-out",
        "tls.csr",
        "-subj",
        "/CN=kcached",
        cwd=d,
    )
    with open(os.path.join(d, "leaf.ext"), "w") as f:
        f.write(
            "subjectAltName=DNS:kcached,IP:127.0.0.1\nextendedKeyUsage=serverAuth\n"
        )
    openssl(
        "x509",
        "-req",
        "-in",
        "tls.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-out",
        "tls.crt",
        "-days",
        "2",
        "-extfile",
        "leaf.ext",
        cwd=d,
    )
    return os.path.join(d, "ca.crt")


class Server:
    """kcached as deploy/k8s/kcached.yaml runs it: the StatefulSet's
    container with its environment and its Secrets' files (a token file,
    the TLS pair), each 0.0.0.0 port on a free loopback port. Then its
    startup probe, and the Prometheus scrape the pod is annotated for."""

    def __init__(self, d):
        self.dir = d
        os.makedirs(d, exist_ok=True)
        self.ca = make_pki(d)
        self.tls = {k: os.path.join(d, k) for k in ("tls.crt", "tls.key")}
        self.tokens, lines = {}, []
        for role in ("read", "write"):
            out = subprocess.run(
                [A.kcached, "token", role, role + "er"],
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            body = [x for x in out.splitlines() if not x.startswith("#")]
            self.tokens[role] = body[0].strip()
            lines.append(body[1].strip())
        self.token_file = os.path.join(d, "tokens")
        with open(self.token_file, "w") as f:
            f.write("\n".join(lines) + "\n")
        sts = [
            x
            for x in docs("deploy", "k8s", "kcached.yaml")
            if x["kind"] == "StatefulSet"
        ][0]
        self.ports = {}  # container port name -> port here
        c = sts["spec"]["template"]["spec"]["containers"][0]
        for p in c["ports"]:
            self.ports[p["name"]] = (p["containerPort"], free_port())
        self.port, self.resp_port = (
            self.ports["https"][1],
            self.ports["redis"][1],
        )
        pod = Pod(sts, "kcached", {}, {}, os.path.join(d, "pod"), self)
        env = {"PATH": os.environ.get("PATH", "")}
        for k, v in pod.env.items():
            for cport, here in self.ports.values():
                v = v.replace("0.0.0.0:%d" % cport, "127.0.0.1:%d" % here)
            env[k] = v
        self.health = self.ports["health"][1]
        self.log = open(os.path.join(d, "kcached.log"), "ab")
        self.proc = subprocess.Popen(
            [A.kcached], env=env, stdout=self.log, stderr=self.log
        )
        probe = c["startupProbe"]["httpGet"]
        for _ in range(200):
            if (
                self.get(
                    probe["path"], probe["port"], probe.get("scheme", "HTTP")
                )
                == 200
            ):
                break
            if self.proc.poll() is not None:
                raise RuntimeError("kcached exited:\n" + self.log_tail())
            time.sleep(0.05)
        else:
            raise RuntimeError(
                "kcached's startup probe failed:\n" + self.log_tail()
            )
        ann = sts["spec"]["template"]["metadata"]["annotations"]
        port = [
            n
            for n, (cp, _) in self.ports.items()
            if cp == int(ann["prometheus.io/port"])
        ][0]
        self.scrape = self.get(
            ann["prometheus.io/path"], port, ann["prometheus.io/scheme"]
        )

    def get(self, path, port_name, scheme):
        import ssl

        ctx = ssl.create_default_context(cafile=self.ca)
        url = "%s://127.0.0.1:%d%s" % (
            scheme.lower(),
            self.ports[port_name][1],
            path,
        )
        try:
            with urllib.request.urlopen(url, timeout=5, context=ctx) as r:
                return r.status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def log_tail(self):
        with open(
            os.path.join(self.dir, "kcached.log"), errors="replace"
        ) as f:
            return f.read()[-3000:]

    def where(self, value):
        """The cluster's Service names point at this kcached."""
        return value.replace(
            "kcached:8080", "127.0.0.1:%d" % self.port
        ).replace("kcached:6379", "127.0.0.1:%d" % self.resp_port)

    def stop(self):
        self.proc.terminate()
        self.proc.wait(timeout=30)
        self.log.close()


def setUpModule():
    global SRV
    SRV = Server(tempfile.mkdtemp(prefix="kc-examples-"))


def tearDownModule():
    SRV.stop()
    shutil.rmtree(SRV.dir, ignore_errors=True)


def read(*parts):
    with open(os.path.join(A.root, *parts), encoding="utf-8") as f:
        return f.read()


def text(p):
    with open(p, encoding="utf-8") as f:
        return f.read()


def docs(*parts):
    return [d for d in yaml.safe_load_all(read(*parts)) if d]


def configmap_recipe(text, name):
    """{key: repo path} of `kubectl create configmap NAME --from-file=K=P ...`
    in a file's comments."""
    joined = re.sub(r"\\\n#\s*", " ", text)
    m = re.search(
        r"kubectl create configmap %s\b([^\n]*)" % re.escape(name), joined
    )
    assert m, "no `kubectl create configmap %s` recipe" % name
    return dict(re.findall(r"--from-file=([\w.-]+)=(\S+)", m.group(1)))


def nvrtc_from_dockerfile(dest):
    """Runs Dockerfile.nvrtc's pip install (its /opt/nvrtc under dest) and
    returns the path its ENV KCACHE_NVRTC names, there."""
    stages = test_deploy.Dockerfile.stages_of(
        read("deploy", "container", "Dockerfile.nvrtc")
    )
    run = " ".join(a for w, a in stages[0]["ins"] if w == "RUN")
    cmds = [c.strip() for c in run.split("&&")]
    pip = [c for c in cmds if " pip install " in c]
    check = [c for c in cmds if c.startswith("test -f")]
    assert len(pip) == 1 and len(check) == 1, cmds
    for c in pip + check:
        r = subprocess.run(
            c.replace("/opt/nvrtc", dest + "/opt/nvrtc"),
            shell=True,
            capture_output=True,
            text=True,
        )
        assert r.returncode == 0, "%s: %s" % (c, r.stderr[-2000:])
    copy = [a for w, a in stages[1]["ins"] if w == "COPY"][0].split()
    src, dst = copy[-2], copy[-1]
    env = dict(
        p.split("=", 1)
        for w, a in stages[1]["ins"]
        if w == "ENV"
        for p in shlex.split(a)
    )
    lib = env["KCACHE_NVRTC"]
    assert lib.startswith(dst), (lib, dst)
    return os.path.join(dest + src, lib[len(dst) :])


class Pod:
    """A pod spec's container, run here: volumes made in a temp dir, paths
    and Service names rewritten, the image's tools given by image_env."""

    def __init__(self, doc, container, recipe, tokens, tmp, srv=None):
        srv = srv or SRV
        spec = doc["spec"]["template"]["spec"]
        c = [
            x
            for x in spec.get("initContainers", []) + spec["containers"]
            if x["name"] == container
        ][0]
        vols = {v["name"]: v for v in spec["volumes"]}
        self.mounts = {}
        for m in c["volumeMounts"]:
            d = os.path.join(tmp, m["name"])
            self.mounts[m["mountPath"].rstrip("/")] = d
            if os.path.isdir(d):  # shared with another container of the pod
                continue
            os.makedirs(d)
            v = vols.get(
                m["name"], {}
            )  # else a volumeClaimTemplate's: a directory
            if "emptyDir" in v:  # fsGroup: group-owned, group-writable, setgid
                os.chmod(d, 0o2777)
            for it in v.get("configMap", {}).get("items", []):
                assert it["key"] in recipe, (
                    "ConfigMap key %s not in its recipe" % it["key"]
                )
                dst = os.path.join(d, it["path"])
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy(os.path.join(A.root, recipe[it["key"]]), dst)
            if "secret" in v:  # no items: a TLS Secret's two keys
                files = dict(
                    srv.tls, **{"ca.crt": srv.ca, "tokens": srv.token_file}
                )
                items = v["secret"].get("items") or [
                    {"key": k, "path": k} for k in srv.tls
                ]
                for it in items:
                    dst = os.path.join(d, it["path"])
                    shutil.copy(files[it["key"]], dst)
                    os.chmod(dst, v["secret"].get("defaultMode", 0o644))
        self.env = {}
        for e in c.get("env", []):
            if "value" in e:
                self.env[e["name"]] = self.path(srv.where(str(e["value"])))
            else:
                ref = e["valueFrom"]["secretKeyRef"]
                self.env[e["name"]] = tokens[ref["name"]]
        self.argv = [
            self.path(a) for a in c.get("command", []) + c.get("args", [])
        ]

    def path(self, s):
        """Mount paths in s (a path, or a URL's query) to their directories,
        in one pass: a directory made under /tmp is not rewritten again."""
        alts = "|".join(
            re.escape(mp) for mp in sorted(self.mounts, key=len, reverse=True)
        )
        return re.sub(
            r"(?<![\w/.-])(%s)(?=/|$|&)" % alts,
            lambda m: self.mounts[m.group(1)],
            s,
        )

    def run(self, image_env, exe):
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": "/nonexistent",
        }
        env.update(image_env)
        env.update(self.env)
        argv = [exe] + self.argv[1:] if self.argv[0] == "kcache" else self.argv
        return subprocess.run(
            argv, env=env, capture_output=True, text=True, timeout=600
        )


class KubernetesPods(unittest.TestCase):
    """kcached.yaml's kcached (the server of every test here),
    inference.yaml's init container and prepopulate-job.yaml's job."""

    def test_kcached_probes_and_scrape(self):
        self.assertEqual(SRV.get("/readyz", "health", "HTTPS"), 200)
        self.assertEqual(
            SRV.scrape, 200, "the Prometheus scrape of the annotations"
        )

    def test_init_container_and_job(self):
        tmp = tempfile.mkdtemp(prefix="kc-pods-", dir=SRV.dir)
        inf = read("deploy", "k8s", "inference.yaml")
        recipe = configmap_recipe(inf, "demo-mlp-warmup")
        tokens = {
            "kcache-client": SRV.tokens["read"],
            "kcache-writer": SRV.tokens["write"],
        }
        dep = [
            d
            for d in docs("deploy", "k8s", "inference.yaml")
            if d["kind"] == "Deployment"
        ][0]
        job = [
            d
            for d in docs("deploy", "k8s", "prepopulate-job.yaml")
            if d["kind"] == "Job"
        ][0]
        # the kcache image: no NVRTC, no toolkit (CUDA_HOME unset)
        no_nvrtc = {}
        init = Pod(
            dep, "kcache-warm", recipe, tokens, os.path.join(tmp, "pod1")
        )
        r = init.run(no_nvrtc, A.kcache)
        self.assertEqual(
            r.returncode,
            0,
            "an empty kcached blocked the rollout:\n" + r.stderr,
        )
        self.assertIn("16 failed", r.stdout + r.stderr)
        # the job, with the NVRTC its image installs
        lib = nvrtc_from_dockerfile(os.path.join(tmp, "nvrtc-image"))
        pj = Pod(job, "warm", recipe, tokens, os.path.join(tmp, "job"))
        r = pj.run({"KCACHE_NVRTC": lib}, A.kcache)
        self.assertEqual(r.returncode, 0, r.stdout[-2000:] + r.stderr[-3000:])
        report = json.loads(r.stdout)
        statuses = [b["status"] for b in report["items"]]
        self.assertEqual(statuses, ["built"] * 16, r.stdout[-2000:])
        # a new replica's init container: everything from kcached, no NVRTC
        init = Pod(
            dep, "kcache-warm", recipe, tokens, os.path.join(tmp, "pod2")
        )
        r = init.run(no_nvrtc, A.kcache)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(
            "16 hit-remote", r.stdout + r.stderr, r.stdout + r.stderr
        )
        out = init.path("/kcache/bundles")
        cubins = [
            f for _, _, fs in os.walk(out) for f in fs if f.endswith(".cubin")
        ]
        self.assertEqual(len(cubins), 16 * 3)

    def test_pins_make_nvrtc_unneeded(self):
        """The image really has no NVRTC here: without the manifest's pins
        the same command cannot compute a key."""
        tmp = tempfile.mkdtemp(prefix="kc-nopin-", dir=SRV.dir)
        m = json.loads(read("deploy", "examples", "demo-mlp", "warmup.json"))
        self.assertEqual(
            {k: m["toolchain"].get(k) for k in ("cuda", "nvrtc")},
            {"cuda": "13.0", "nvrtc": "13.0"},
        )
        del m["toolchain"]["cuda"], m["toolchain"]["nvrtc"]
        shutil.copytree(
            os.path.join(A.root, "deploy", "examples", "demo-mlp", "kernels"),
            os.path.join(tmp, "kernels"),
        )
        with open(os.path.join(tmp, "warmup.json"), "w") as f:
            json.dump(m, f)
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": "/nonexistent",
            "KCACHE_DIR": os.path.join(tmp, "kc"),
            "KCACHE_URL": "https://127.0.0.1:%d" % SRV.port,
            "KCACHE_CACERT": SRV.ca,
            "KCACHE_TOKEN": SRV.tokens["read"],
        }
        r = subprocess.run(
            [A.kcache, "warm", os.path.join(tmp, "warmup.json"), "--no-build"],
            env=env,
            capture_output=True,
            text=True,
        )
        self.assertIn("NVRTC not found", r.stderr)
        # without --strict, a warning: the pod starts all the same
        self.assertEqual(r.returncode, 0, r.stderr)

    def test_job_fails_on_a_refused_token(self):
        """--strict (the job): a token kcached refuses (401) or one that may
        not write (403) fails the Job rather than leaving the fleet cold."""
        tmp = tempfile.mkdtemp(prefix="kc-strict-", dir=SRV.dir)
        srv = Server(
            os.path.join(tmp, "kcached")
        )  # empty: the job must upload
        self.addCleanup(srv.stop)
        recipe = configmap_recipe(
            read("deploy", "k8s", "inference.yaml"), "demo-mlp-warmup"
        )
        job = [
            d
            for d in docs("deploy", "k8s", "prepopulate-job.yaml")
            if d["kind"] == "Job"
        ][0]
        lib = nvrtc_from_dockerfile(os.path.join(tmp, "nvrtc-image"))
        for name, token in (
            ("unknown", "0" * 64),
            ("read", srv.tokens["read"]),
        ):
            pj = Pod(
                job,
                "warm",
                recipe,
                {"kcache-writer": token},
                os.path.join(tmp, name),
                srv,
            )
            r = pj.run({"KCACHE_NVRTC": lib}, A.kcache)
            self.assertNotEqual(
                r.returncode, 0, "%s token: %s" % (name, r.stderr[-2000:])
            )
            print(
                "%s token: exit %d: %s"
                % (name, r.returncode, r.stderr.strip().splitlines()[-1:])
            )


class CiWorkflow(unittest.TestCase):
    """deploy/ci/warmup.yml's jobs, their run steps in order, in a
    checkout's copy, with the NVRTC of the warm job's CUDA (13.0, as the
    manifest pins) for one arch of the matrix: not the apt-get and cmake
    steps (this build's kcache stands in), nor the uses: steps (the
    artifact the first job uploads is the file the second reads)."""

    def expr(self, value, arch):
        srv = self.srv
        subs = {
            "matrix.arch": arch,
            "vars.KCACHE_URL": "https://127.0.0.1:%d" % srv.port,
            "secrets.KCACHE_WRITE_TOKEN": srv.tokens["write"],
            "secrets.KCACHE_READ_TOKEN": srv.tokens["read"],
            "secrets.KCACHE_CACERT": text(srv.ca),
            "vars.KCACHE_BUCKETS || 4": "4",
        }

        def one(m):
            return subs[m.group(1).strip()]

        return re.sub(r"\$\{\{([^}]*)\}\}", one, str(value))

    def test_jobs_run(self):
        tmp = tempfile.mkdtemp(prefix="kc-ci-", dir=SRV.dir)
        self.srv = Server(
            os.path.join(tmp, "kcached")
        )  # its own: the pods' starts empty
        self.addCleanup(self.srv.stop)
        wf = yaml.safe_load(read("deploy", "ci", "warmup.yml"))
        co = os.path.join(tmp, "checkout")
        shutil.copytree(
            os.path.join(A.root, "deploy", "examples"),
            os.path.join(co, "deploy", "examples"),
        )
        os.makedirs(os.path.join(co, "build", "client"))
        os.symlink(A.kcache, os.path.join(co, "build", "client", "kcache"))
        lib = nvrtc_from_dockerfile(os.path.join(tmp, "nvrtc"))
        arch = wf["jobs"]["warm"]["strategy"]["matrix"]["arch"][0]
        ran = []
        for name in ("suggest", "warm"):
            job = wf["jobs"][name]
            runner = os.path.join(tmp, "runner-" + name)
            os.makedirs(runner)
            genv, gpath = (
                os.path.join(runner, "env"),
                os.path.join(runner, "path"),
            )
            open(genv, "w").close()
            open(gpath, "w").close()
            base = {
                "PATH": os.path.dirname(A.kcache)
                + os.pathsep
                + os.environ.get("PATH", ""),
                "HOME": runner,
                "RUNNER_TEMP": runner,
                "GITHUB_ENV": genv,
                "GITHUB_PATH": gpath,
                "KCACHE_NVRTC": lib,
            }
            for k, v in list(wf.get("env", {}).items()) + list(
                job.get("env", {}).items()
            ):
                base[k] = self.expr(v, arch)
            for step in job["steps"]:
                run = step.get("run")
                if not run or "apt-get" in run or "cmake" in run:
                    continue
                env = dict(base)
                env.update(
                    {
                        k: self.expr(v, arch)
                        for k, v in step.get("env", {}).items()
                    }
                )
                with open(genv) as f:  # what earlier steps appended
                    env.update(
                        ln.rstrip("\n").split("=", 1) for ln in f if "=" in ln
                    )
                r = subprocess.run(
                    ["bash", "-e", "-c", self.expr(run, arch)],
                    cwd=co,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                self.assertEqual(
                    r.returncode,
                    0,
                    "%s / %s:\n%s%s"
                    % (
                        name,
                        step.get("name"),
                        r.stdout[-2000:],
                        r.stderr[-2000:],
                    ),
                )
                self.assertNotIn("::warning::", r.stdout, step.get("name"))
                ran.append(step.get("name"))
        self.assertIn("KCACHE_CACERT", text(genv))
        report = json.loads(text(os.path.join(co, "warm-%s.json" % arch)))
        self.assertEqual({i["status"] for i in report["items"]}, {"built"})
        self.assertEqual(len(ran), 5, ran)


class Dockerfiles(unittest.TestCase):
    FILES = [
        ("deploy", "container", "Dockerfile"),
        ("deploy", "container", "Dockerfile.nvrtc"),
        ("deploy", "examples", "torch-service", "Dockerfile"),
    ]

    def test_every_dockerfile_is_tested(self):
        found = sorted(
            os.path.relpath(os.path.join(d, f), A.root)
            for d, _, fs in os.walk(os.path.join(A.root, "deploy"))
            for f in fs
            if f.startswith("Dockerfile")
        )
        self.assertEqual(found, sorted(os.path.join(*p) for p in self.FILES))

    def test_apt_lists_resolve(self):
        if not shutil.which("apt-get"):
            if os.environ.get("CI") == "true":
                self.fail("apt-get needed")
            self.skipTest("not a Debian host")
        for f in self.FILES:
            for st in test_deploy.Dockerfile.stages_of(read(*f)):
                run = " ".join(a for w, a in st["ins"] if w == "RUN")
                for m in re.finditer(r"apt-get install ([^&]*)", run):
                    pkgs = [
                        w for w in m.group(1).split() if not w.startswith("-")
                    ]
                    r = subprocess.run(
                        [
                            "apt-get",
                            "-s",
                            "-qq",
                            "install",
                            "--no-install-recommends",
                        ]
                        + pkgs,
                        capture_output=True,
                        text=True,
                    )
                    self.assertEqual(
                        r.returncode, 0, "%s: %s" % ("/".join(f), r.stderr)
                    )

    def test_copy_sources_exist(self):
        for f in self.FILES:
            for st in test_deploy.Dockerfile.stages_of(read(*f)):
                for w, a in st["ins"]:
                    parts = shlex.split(a)
                    if w == "COPY" and not any(
                        p.startswith("--from") for p in parts
                    ):
                        for src in parts[:-1]:
                            self.assertTrue(
                                os.path.exists(os.path.join(A.root, src)), src
                            )

    def test_torch_service_pins_are_the_tested_ones(self):
        pins = (
            re.search(r"pins=\(([^)]*)\)", read("scripts", "pyenv.sh"))
            .group(1)
            .split()
        )
        run = " ".join(
            a
            for st in test_deploy.Dockerfile.stages_of(
                read("deploy", "examples", "torch-service", "Dockerfile")
            )
            for w, a in st["ins"]
            if w == "RUN"
        )
        used = re.findall(r"\b([a-z]+==[\w.]+)", run)
        self.assertTrue(used)
        self.assertEqual(set(used) - set(pins), set())
        self.assertIn("pip install --no-cache-dir ./python", run)

    def test_nvrtc_is_the_pinned_cuda(self):
        pin = re.search(
            r"KCACHE_NVRTC_PIN:-([\d.]+)", read("scripts", "nvrtc.sh")
        ).group(1)
        self.assertIn(
            "nvidia-cuda-nvrtc==%s" % pin,
            read("deploy", "container", "Dockerfile.nvrtc"),
        )
        m = json.loads(read("deploy", "examples", "demo-mlp", "warmup.json"))
        self.assertTrue(pin.startswith(m["toolchain"]["cuda"] + "."))
        # the CI example builds the same manifest: the same CUDA
        images = re.findall(
            r"container: nvidia/cuda:(\d+\.\d+)\.",
            read("deploy", "ci", "warmup.yml"),
        )
        self.assertEqual(set(images), {m["toolchain"]["cuda"]})


class TorchService(unittest.TestCase):
    """entrypoint.py as deployment.yaml runs it, through TLS."""

    def setUp(self):
        if not (
            A.venv and A.lib
        ):  # a sanitizer build: its lib cannot load into python
            self.skipTest("no --venv and --lib")
        py = os.path.join(A.venv, "bin", "python")
        if not (
            os.path.exists(py)
            and subprocess.run(
                [py, "-c", "import torch"], capture_output=True
            ).returncode
            == 0
        ):
            if os.environ.get("CI") == "true":
                self.fail(
                    "no torch in %s (scripts/pyenv.sh makes it)" % A.venv
                )
            self.skipTest("no torch in %s" % A.venv)
        self.py = py

    def replica(self, token_role, tmp):
        dep = docs("deploy", "examples", "torch-service", "deployment.yaml")[0]
        pod = Pod(
            dep, "app", {}, {"kcache-client": SRV.tokens[token_role]}, tmp
        )
        self.assertEqual(pod.argv[:2], ["python3", "/app/entrypoint.py"])
        port = free_port()
        env = {
            "PATH": os.environ.get("PATH", ""),
            "HOME": tmp,
            "PYTHONPATH": os.path.join(A.root, "python"),
            "KCACHE_LIB": A.lib,
            "PYTHONDONTWRITEBYTECODE": "1",
            "PORT": str(port),
            "TMPDIR": pod.path("/tmp"),
        }
        env.update(pod.env)
        os.makedirs(tmp, exist_ok=True)
        entry = os.path.join(
            A.root, "deploy", "examples", "torch-service", "entrypoint.py"
        )
        errf = open(os.path.join(tmp, "stderr"), "w+")
        proc = subprocess.Popen(
            [self.py, entry],
            env=env,
            stdout=subprocess.PIPE,
            stderr=errf,
            text=True,
        )
        try:
            line = proc.stdout.readline()
            errf.seek(0)
            self.assertTrue(line, errf.read()[-4000:])
            out = json.loads(line)
            for _ in range(100):
                try:
                    with urllib.request.urlopen(
                        "http://127.0.0.1:%d/healthz" % port, timeout=5
                    ) as r:
                        self.assertEqual(r.status, 200)
                        break
                except OSError:
                    time.sleep(0.1)
            else:
                self.fail("no /healthz")
            return out, pod
        finally:
            proc.terminate()
            proc.wait(timeout=30)
            proc.stdout.close()
            errf.close()

    def test_second_replica_starts_from_the_first(self):
        tmp = tempfile.mkdtemp(prefix="kc-torch-", dir=SRV.dir)
        first, pod = self.replica("write", os.path.join(tmp, "a"))
        self.assertGreaterEqual(
            first["torch_counters"].get("fxgraph_cache_miss", 0), 1, first
        )
        second, _ = self.replica("read", os.path.join(tmp, "b"))
        c = second["torch_counters"]
        self.assertGreaterEqual(c.get("fxgraph_cache_hit", 0), 1, second)
        self.assertEqual(c.get("fxgraph_cache_miss", 0), 0, second)
        # through the CA the pod mounts, on both ports
        self.assertTrue(os.path.isfile(pod.env["KCACHE_CACERT"]))
        self.assertIn(
            "ssl_ca_certs=" + pod.env["KCACHE_CACERT"],
            pod.env["KCACHE_RESP_URL"],
        )


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--kcached", required=True)
    ap.add_argument("--kcache", required=True)
    ap.add_argument("--venv")
    ap.add_argument("--lib")
    A, rest = ap.parse_known_args()
    A.root = os.path.abspath(A.root)
    test_deploy.ROOT = A.root
    unittest.main(argv=[sys.argv[0]] + rest, verbosity=2)
