#!/usr/bin/env python3
"""container_chroot.py: builds deploy/container/Dockerfile without a Docker
engine, by carrying out its instructions in two Debian 12 chroots made with
debootstrap (minbase), then starts the result as the Dockerfile's USER and
runs its HEALTHCHECK command.

A static check can say that the package lists name every dependency; only a
build from an empty Debian says that the container builds and that kcached
starts in the runtime stage with what that stage installs. Docker is not on
these machines (only its client), so FROM, RUN, ENV, WORKDIR, COPY and USER
are interpreted here, and the rest (EXPOSE, VOLUME, ...) is metadata.

Usage: container_chroot.py --root REPO [--work DIR]
Exit 0 when both stages built and the health check passed, 77 (skip) when not
root or debootstrap is missing (a failure under CI=true), 1 otherwise.
"""

import argparse
import json
import os
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_deploy  # noqa: E402  (the Dockerfile parser)

SUITE = "bookworm"


def log(msg):
    print("container_chroot: " + msg, flush=True)


def mirror():
    """The host's Debian mirror (this machine reaches Debian's, not others)."""
    for f in (
        "/etc/apt/sources.list.d/debian.sources",
        "/etc/apt/sources.list",
    ):
        try:
            for line in open(f, encoding="utf-8"):
                w = line.split()
                if w[:1] == ["URIs:"] and "security" not in w[1]:
                    return w[1]
                if w[:1] == ["deb"] and "security" not in line:
                    return next(x for x in w[1:] if x.startswith("http"))
        except (OSError, StopIteration, IndexError):
            continue
    return "http://deb.debian.org/debian"


class Stage:
    """One FROM's file system, with the state its instructions build up."""

    def __init__(self, root):
        self.root, self.env, self.cwd, self.user = root, {}, "/", "0:0"
        self.env["PATH"] = (
            "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        )

    def host(self, p):
        return os.path.join(self.root, p.lstrip("/"))

    def run(self, cmd, user=None, check=True, **kw):
        env = dict(self.env, HOME="/root", DEBIAN_FRONTEND="noninteractive")
        argv = ["chroot"]
        if user:
            argv.append("--userspec=" + user)
        argv += [
            self.root,
            "/bin/sh",
            "-c",
            "cd %s && %s" % (shlex.quote(self.cwd), cmd),
        ]
        return subprocess.run(argv, env=env, check=check, **kw)


def copy_into(stage, srcs, dst, base):
    dst_abs = dst if dst.startswith("/") else os.path.join(stage.cwd, dst)
    for src in srcs:
        s = os.path.join(base, src)
        d = stage.host(dst_abs)
        if os.path.isdir(s):
            shutil.copytree(s, d, dirs_exist_ok=True, symlinks=True)
        else:
            os.makedirs(
                d if dst.endswith("/") else os.path.dirname(d), exist_ok=True
            )
            shutil.copy2(s, d)


def carry_out(stage, ins, repo, stages_by_name):
    for word, args in ins:
        if word == "RUN":
            log("RUN " + " ".join(args.split())[:100])
            r = stage.run(
                args,
                check=False,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
            if r.returncode:
                log(
                    "RUN failed (exit %d); its output ends:\n%s"
                    % (r.returncode, r.stdout[-4000:])
                )
                raise subprocess.CalledProcessError(
                    r.returncode, ["RUN", args]
                )
        elif word == "ENV":
            parts = shlex.split(args)
            for p in parts:
                k, _, v = p.partition("=")
                stage.env[k] = v.replace("$PATH", stage.env["PATH"])
        elif word == "WORKDIR":
            stage.cwd = args
            os.makedirs(stage.host(args), exist_ok=True)
        elif word in ("COPY", "ADD"):
            parts = shlex.split(args)
            opts = [p for p in parts if p.startswith("--")]
            paths = [p for p in parts if not p.startswith("--")]
            frm = [o.split("=", 1)[1] for o in opts if o.startswith("--from=")]
            base = stages_by_name[frm[0]].root if frm else repo
            srcs = [s.lstrip("/") for s in paths[:-1]] if frm else paths[:-1]
            copy_into(stage, srcs, paths[-1], base)
        elif word == "USER":
            stage.user = args


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def health_check(stage, hc_args):
    """Starts the ENTRYPOINT as USER on loopback, runs the HEALTHCHECK CMD."""
    port = free_port()
    stage.env["KCACHED_LISTEN"] = "127.0.0.1:%d" % port
    entry = json.loads(
        stage.entrypoint
    )  # the exec form, as the Dockerfile test requires
    proc = subprocess.Popen(
        ["chroot", "--userspec=" + stage.user, stage.root] + entry,
        env=dict(stage.env),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    cmd = hc_args.split(" CMD ", 1)[1]
    r = None
    try:
        for _ in range(100):
            if proc.poll() is not None:
                break
            r = stage.run(
                cmd,
                user=stage.user,
                check=False,
                capture_output=True,
                text=True,
            )
            if r.returncode == 0:
                log(
                    "HEALTHCHECK passed against kcached as uid %s" % stage.user
                )
                return True
            time.sleep(0.2)
        log(
            "HEALTHCHECK failed: "
            + (
                (r.stderr or "").strip()
                if r
                else "kcached exited before the first probe"
            )
        )
        return False
    finally:
        proc.terminate()
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if out:
            log("kcached said:\n" + out[-2000:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument(
        "--work", help="a directory to keep (default: a temp dir, removed)"
    )
    a = ap.parse_args()
    ci = os.environ.get("CI") == "true"
    if (
        os.geteuid() != 0
        or not shutil.which("debootstrap")
        or not shutil.which("chroot")
    ):
        log("needs root, debootstrap and chroot")
        return 1 if ci else 77
    repo = os.path.abspath(a.root)
    stages = test_deploy.Dockerfile.stages_of(
        open(
            os.path.join(repo, "deploy", "container", "Dockerfile"),
            encoding="utf-8",
        ).read()
    )
    work = a.work or tempfile.mkdtemp(prefix="kcache-chroot-")
    mounts = []
    try:
        base = os.path.join(work, "base")
        if not os.path.isfile(os.path.join(base, "etc", "debian_version")):
            t = time.time()
            subprocess.run(
                ["debootstrap", "--variant=minbase", SUITE, base, mirror()],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            log("debootstrap %s: %.0f s" % (SUITE, time.time() - t))
        shutil.copy2(
            "/etc/resolv.conf", os.path.join(base, "etc", "resolv.conf")
        )
        by_name, order = {}, []
        for i, st in enumerate(stages):
            from_words = st["from"].split()
            if not from_words[0].startswith("debian:bookworm"):
                log(
                    "FROM %s: only debian:bookworm images are interpreted"
                    % st["from"]
                )
                return 1
            root = os.path.join(work, "stage%d" % i)
            if os.path.isdir(root):
                subprocess.run(["rm", "-rf", root], check=True)
            subprocess.run(["cp", "-a", base, root], check=True)
            subprocess.run(
                ["mount", "-t", "proc", "proc", os.path.join(root, "proc")],
                check=True,
            )
            mounts.append(os.path.join(root, "proc"))
            stage = Stage(root)
            name = (
                from_words[-1]
                if len(from_words) == 3 and from_words[1].upper() == "AS"
                else str(i)
            )
            by_name[name] = stage
            order.append(stage)
            t = time.time()
            carry_out(stage, st["ins"], repo, by_name)
            log("stage %s built in %.0f s" % (name, time.time() - t))
        last = order[-1]
        ins = stages[-1]["ins"]
        last.entrypoint = [a for w, a in ins if w == "ENTRYPOINT"][-1]
        hcs = [a for w, a in ins if w == "HEALTHCHECK"]
        if not hcs:
            log("no HEALTHCHECK")
            return 1
        return 0 if health_check(last, hcs[-1]) else 1
    except subprocess.CalledProcessError as e:
        log(
            "failed: %s (exit %s)"
            % (" ".join(map(str, e.cmd))[:300], e.returncode)
        )
        return 1
    finally:
        for m in mounts:
            subprocess.run(["umount", "-l", m], check=False)
        if not a.work:
            subprocess.run(
                ["rm", "-rf", "--one-file-system", work], check=False
            )


if __name__ == "__main__":
    sys.exit(main())
