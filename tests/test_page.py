#!/usr/bin/python3
"""test_page.py: kcached's page (GET /) in a real browser: Debian's chromium,
headless, against a real kcached filled by `kcache warm`.

usage: test_page.py KCACHED KCACHE ARTIFACTS_DIR

Checks the DOM after the page's scripts ran (--dump-dom): the model's name,
its coverage matrix with the right present, missing and building cells, and
figures equal to the API's; a model named <img src=x onerror=alert(1)> stays
text (no <img> element at all); with a token file the page asks for a token,
and a read token sees the models but no purge button, an admin token does;
its purge asks for the model's hash and deletes nothing on a wrong answer.
With --resp-listen the page shows the RESP reads per key family (a family
named <img/src=x/onerror=alert(1)> stays text too); without it, no such table.
Its two charts share one time axis, and both say "no data yet" when empty.
A screenshot goes to ARTIFACTS_DIR/page.png.

The token is given the way a person gives it: typed into the page's own form
(which keeps it in sessionStorage and sends it as a Bearer header). Headless
chromium is driven for that through the DevTools protocol over
--remote-debugging-pipe (file descriptors 3 and 4, no port, nothing in a
URL); the test then checks that the token appears in no URL the page shows.

Exit 0 pass, 1 fail, 77 skip (no chromium; a failure instead when CI=true).
"""

import hashlib
import html.parser
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

import kcharness

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--disable-gpu",
    "--no-sandbox",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]


def fail(msg):
    print("FAIL: " + msg, file=sys.stderr)
    sys.exit(1)


def check(cond, msg):
    if not cond:
        fail(msg)


# ---- a DOM from --dump-dom ----


class Node:
    def __init__(self, tag, attrs, parent):
        self.tag, self.attrs, self.parent = tag, dict(attrs), parent
        self.kids, self.text = [], []

    def all_text(self):
        return "".join(self.text) + "".join(k.all_text() for k in self.kids)

    def walk(self):
        yield self
        for k in self.kids:
            yield from k.walk()

    def find_all(self, tag=None, **attrs):
        for n in self.walk():
            if tag and n.tag != tag:
                continue
            if all(
                n.attrs.get(k.rstrip("_").replace("_", "-")) == v
                for k, v in attrs.items()
            ):
                yield n

    def find(self, tag=None, **attrs):
        return next(self.find_all(tag, **attrs), None)

    def has_class(self, c):
        return c in (self.attrs.get("class") or "").split()


VOID = {
    "meta",
    "link",
    "input",
    "br",
    "img",
    "hr",
    "source",
    "area",
    "base",
    "col",
    "embed",
    "param",
    "track",
    "wbr",
}


class DomParser(html.parser.HTMLParser):
    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#root", [], None)
        self.cur = self.root

    def handle_starttag(self, tag, attrs):
        n = Node(tag, attrs, self.cur)
        self.cur.kids.append(n)
        if tag not in VOID:
            self.cur = n

    def handle_startendtag(self, tag, attrs):
        self.cur.kids.append(Node(tag, attrs, self.cur))

    def handle_endtag(self, tag):
        n = self.cur
        while n is not self.root and n.tag != tag:
            n = n.parent
        if n is not self.root:
            self.cur = n.parent

    def handle_data(self, data):
        self.cur.text.append(data)


def parse(dom):
    p = DomParser()
    p.feed(dom)
    return p.root


# ---- kcached and the API ----


class Server(kcharness.Kcached):
    """kcharness's kcached, and its JSON API."""

    def api(self, path, method="GET", body=None, token=None):
        req = urllib.request.Request(self.url + path, method=method, data=body)
        if body is not None:
            req.add_header("Content-Type", "application/json")
        if token:
            req.add_header("Authorization", "Bearer " + token)
        with urllib.request.urlopen(req, timeout=10) as r:
            return json.loads(r.read() or b"null")

    def stop(self):
        """SIGTERM; kcached must exit 0 (a sanitizer's report would not)."""
        return super().stop(want_rc=0)


def resp_send(port, *cmds):
    """Sends RESP commands (multibulk) on one connection, then EOF; the
    replies, read until kcached closes it."""
    data = b""
    for c in cmds:
        data += b"*%d\r\n" % len(c)
        for a in c:
            a = a.encode()
            data += b"$%d\r\n%s\r\n" % (len(a), a)
    with socket.create_connection(("127.0.0.1", port), 10) as s:
        s.settimeout(10)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            d = s.recv(65536)
            if not d:
                return out
            out += d


EVIL_FAMILY = "<img/src=x/onerror=alert(1)>"


def resp_reads(port):
    """pt2: 2 hits, 1 miss; the hostile family: 1 miss."""
    out = resp_send(
        port,
        ("SET", "pt2:a", "1"),
        ("GET", "pt2:a"),
        ("GET", "pt2:a"),
        ("GET", "pt2:b"),
        ("GET", EVIL_FAMILY + ":k"),
    )
    check(
        out == b"+OK\r\n$1\r\n1\r\n$1\r\n1\r\n$-1\r\n$-1\r\n",
        "RESP replies %r" % out,
    )


def check_families(root, srv):
    """The RESP key families table against /v1/stats."""
    sec = root.find("section", id="families-section")
    check(
        sec is not None and "hidden" not in sec.attrs,
        "no RESP key families table with --resp-listen",
    )
    fams = srv.api("/v1/stats")["resp_families"]
    check(
        any(f["family"] == EVIL_FAMILY for f in fams),
        "the hostile family is not in /v1/stats: %s" % fams,
    )
    for f in fams:
        row = root.find("tr", data_family=f["family"])
        check(row is not None, "no row for family %r" % f["family"])
        tds = row.find_all("td")
        name = next(tds).all_text()
        check(name == f["family"], "family %r, API %r" % (name, f["family"]))
        for k in ("hits", "misses"):
            td = next(n for n in row.find_all("td") if n.has_class(k))
            check(
                int(td.attrs["data-value"]) == f[k]
                and td.all_text() == str(f[k]),
                "family %s %s: %s, API %s"
                % (f["family"], k, td.attrs["data-value"], f[k]),
            )
    pt2 = root.find("tr", data_family="pt2")
    ratio = next(n for n in pt2.find_all("td") if n.has_class("ratio"))
    check(
        ratio.all_text() == "66.7 %", "pt2's hit ratio %r" % ratio.all_text()
    )


def model_hash(s):
    return hashlib.sha256(s.encode()).hexdigest()


def warmup(tmp, name, model, archs, buckets, failing=""):
    """A command-builder warmup (no GPU): a file of batch*3000 bytes per
    cell; `failing` is a shell test for cells whose build fails."""
    script = (
        "%s head -c $(( {batch} * 3000 )) /dev/zero > {out}/gemm.cubin"
        % (failing + " && exit 1;" if failing else "")
    )
    doc = {
        "schema": "kcache.warmup/v1",
        "model": {"name": name, "hash": model},
        "archs": archs,
        "builder": {"command": ["sh", "-c", script], "timeout_s": 30},
        "buckets": [{"batch": b} for b in buckets],
    }
    path = os.path.join(tmp, model[:8] + ".json")
    with open(path, "w") as f:
        json.dump(doc, f)
    return path


def kcache(kcache_bin, tmp, *args, token=None):
    env = dict(os.environ, KCACHE_DIR=os.path.join(tmp, "cache"))
    env.pop("KCACHE_URL", None)
    env.pop("KCACHE_TOKEN", None)
    if token:
        env["KCACHE_TOKEN"] = token
    return subprocess.run(
        [kcache_bin, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


# ---- chromium ----


def dump_dom(url):
    r = subprocess.run(
        [CHROMIUM, *FLAGS, "--virtual-time-budget=5000", "--dump-dom", url],
        capture_output=True,
        text=True,
        timeout=120,
    )
    check(
        r.returncode == 0 and "<html" in r.stdout,
        "chromium --dump-dom failed: %s" % r.stderr[-2000:],
    )
    return r.stdout


def screenshot(url, path):
    r = subprocess.run(
        [
            CHROMIUM,
            *FLAGS,
            "--virtual-time-budget=5000",
            "--window-size=1280,900",
            "--screenshot=" + path,
            url,
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    check(
        r.returncode == 0 and os.path.getsize(path) > 1000,
        "chromium --screenshot failed: %s" % r.stderr[-2000:],
    )


class Cdp:
    """Chrome DevTools protocol over --remote-debugging-pipe: commands in on
    fd 3, answers and events out on fd 4, each JSON text ended by a NUL."""

    def __init__(self, tmp):
        cmd_r, self.cmd_w = os.pipe()
        self.out_r, out_w = os.pipe()

        def fds():
            os.dup2(cmd_r, 3)
            os.dup2(out_w, 4)

        self.proc = subprocess.Popen(
            [
                CHROMIUM,
                *FLAGS,
                "--remote-debugging-pipe",
                "--user-data-dir=" + os.path.join(tmp, "chromium-profile"),
                "about:blank",
            ],
            preexec_fn=fds,
            close_fds=False,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(cmd_r)
        os.close(out_w)
        self.buf, self.next_id, self.session = b"", 0, None

    def _read(self):
        while b"\0" not in self.buf:
            chunk = os.read(self.out_r, 65536)
            if not chunk:
                fail("chromium closed the DevTools pipe")
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def call(self, method, params=None, session=True):
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            msg["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(msg).encode() + b"\0")
        while True:
            m = self._read()
            if m.get("id") == self.next_id:
                if "error" in m:
                    fail("%s: %s" % (method, m["error"]))
                return m.get("result", {})

    def open(self, url):
        t = self.call(
            "Target.createTarget", {"url": "about:blank"}, session=False
        )
        a = self.call(
            "Target.attachToTarget",
            {"targetId": t["targetId"], "flatten": True},
            session=False,
        )
        self.session = a["sessionId"]
        self.call("Page.enable")
        self.call("Runtime.enable")
        self.call("Page.navigate", {"url": url})

    def eval(self, expr):
        r = self.call(
            "Runtime.evaluate",
            {"expression": expr, "returnByValue": True, "awaitPromise": True},
        )
        return r.get("result", {}).get("value")

    def wait_for(self, expr, secs=10):
        t0 = time.time()
        while time.time() - t0 < secs:
            if self.eval(expr):
                return True
            time.sleep(0.1)
        return False

    def close(self):
        try:
            self.call("Browser.close", session=False)
        except SystemExit:
            pass
        self.proc.wait(30)
        os.close(self.cmd_w)
        os.close(self.out_r)


# ---- the checks ----


def check_open_page(root, srv, demo, evil):
    """The DOM against the API: names, figures, the matrix of demo."""
    models = {m["model"]: m for m in srv.api("/v1/models")["models"]}
    stats = srv.api("/v1/stats")
    for h in (demo, evil):
        row = root.find("tr", data_model=h)
        check(row is not None, "no row for model %s" % h)
        m = models[h]
        name = row.find("td", **{"class": "name"}).all_text()
        check(name == m["name"], "row name %r, API %r" % (name, m["name"]))
        cov = next(n for n in row.find_all("td") if n.has_class("coverage"))
        want = "%d/%d" % (m["coverage"]["present"], m["coverage"]["expected"])
        check(
            cov.all_text() == want,
            "coverage %r, API %r" % (cov.all_text(), want),
        )
        b = next(n for n in row.find_all("td") if n.has_class("bytes"))
        check(
            int(b.attrs["data-value"]) == m["bytes"],
            "bytes %s, API %s" % (b.attrs["data-value"], m["bytes"]),
        )
        hits = next(n for n in row.find_all("td") if n.has_class("hits"))
        check(int(hits.attrs["data-value"]) == m["hits"], "hits differ")
        check(
            row.find("button") is not None,
            "no purge button without a token file (everyone is admin)",
        )
    check(models[demo]["name"] == "demo-mlp", "demo's name")
    # the hostile name is text: in a cell, and no <img> anywhere
    check(
        models[evil]["name"] == "<img src=x onerror=alert(1)>",
        "the hostile model's name",
    )
    check(root.find("img") is None, "an <img> element made it into the DOM")
    for card, key in (("bundles", "bundles"), ("blobs", "blobs")):
        c = root.find("div", id="card-" + card)
        v = next(n for n in c.find_all("div") if n.has_class("value"))
        check(
            int(v.attrs["data-value"]) == stats[key],
            "card %s: %s, API %s" % (card, v.attrs["data-value"], stats[key]),
        )
    return models


def check_matrix(root, srv, demo):
    cov = srv.api("/v1/models/%s/coverage" % demo)
    name = root.find("span", id="matrix-name").all_text()
    check(name == "demo-mlp", "matrix of %r" % name)
    summary = root.find("p", id="matrix-summary")
    check(
        summary.attrs.get("data-archs-from")
        == cov["archs_from"]
        == "manifest",
        "the matrix's archs come from %r"
        % summary.attrs.get("data-archs-from"),
    )
    cells = [n for n in root.find("table", id="matrix").find_all("td")]
    check(
        len(cells) == cov["expected"],
        "%d cells, API %d expected" % (len(cells), cov["expected"]),
    )
    states = {}
    for i, b in enumerate(cov["buckets"]):
        bt = ",".join("%s=%s" % (k, b[k]) for k in sorted(b))
        for j, a in enumerate(cov["archs"]):
            c = cov["cells"][i][j]
            td = root.find("td", data_bucket=bt, data_arch=a)
            check(td is not None, "no cell %s %s" % (bt, a))
            check(
                td.attrs["data-state"] == c["state"],
                "cell %s %s: %s, "
                "API %s" % (bt, a, td.attrs["data-state"], c["state"]),
            )
            check(int(td.attrs["data-bytes"]) == c["bytes"], "cell bytes")
            check(td.has_class(c["state"]), "cell class")
            check(
                td.attrs.get("title", "").startswith(bt + " on " + a),
                "hover details (title) of %s %s" % (bt, a),
            )
            states[c["state"]] = states.get(c["state"], 0) + 1
    return states


def check_purge_confirm(cdp, srv, token):
    """The page's purge asks for the model's hash, not its name (a name
    comes from a warmup manifest): a wrong answer deletes nothing, the
    hash's first 12 digits purge it."""
    model = cdp.eval(
        "document.querySelector('#models tr[data-model]').dataset.model"
    )
    before = srv.api("/v1/models/" + model, token=token)["bundles"]
    check(len(before) > 0, "the model to purge has bundles")
    # a person who answers with the name, or clicks OK to a yes/no question
    cdp.eval(
        "window.asked = []; window.prompt = (m) => "
        "{ window.asked.push(m); return 'demo-mlp'; };"
        "window.confirm = (m) => { window.asked.push(m); return true; };"
        "document.querySelector('#models button.purge').click(); true"
    )
    check(
        cdp.wait_for(
            "document.getElementById('error').textContent"
            ".includes('not confirmed')"
        ),
        "a purge answered with the name was not refused",
    )
    asked = cdp.eval("window.asked[0]")
    check(
        model in asked, "the purge prompt does not show the hash: %r" % asked
    )
    check(
        len(srv.api("/v1/models/" + model, token=token)["bundles"])
        == len(before),
        "a purge not confirmed deleted bundles",
    )
    cdp.eval(
        "window.prompt = (m) => %s.slice(0, 12);"
        "document.querySelector('#models button.purge').click(); true"
        % json.dumps(model)
    )
    check(
        cdp.wait_for(
            "document.getElementById('error').textContent.startsWith('purged')"
        ),
        "the confirmed purge",
    )
    check(
        srv.api("/v1/models/" + model, token=token)["bundles"] == [],
        "the confirmed purge left bundles",
    )


CHARTS_JS = """(() => {
  renderCharts(%s);
  const out = {};
  for (const id of ['chart-hits', 'chart-rate']) {
    const s = document.getElementById(id);
    const dots = [...s.querySelectorAll('circle')];
    out[id] = {ticks: [...s.querySelectorAll('text.tick')]
                 .map((t) => t.textContent),
               empty: !!s.querySelector('text.empty'),
               line: !!s.querySelector('polyline'),
               lastX: dots.length ? dots[dots.length - 1].getAttribute('cx')
                                  : null};
  }
  return out;
})()"""


def check_charts(tmp, srv):
    """Both charts on one time axis (the hit ratio's used to start at its
    first slot with lookups), and "no data yet" in both when there is none
    (the rate drew a flat 0.0/s line)."""
    now, step = 100000, 10
    pts = [
        {
            "t": now - 1200 + step * i,
            "requests": 5,
            "hits": 3 if i >= 90 else 0,
            "misses": 1 if i >= 90 else 0,
        }
        for i in range(120)
    ]
    idle = [dict(p, requests=0, hits=0, misses=0) for p in pts]
    cases = (("lookups late", pts), ("idle", idle), ("empty", []))
    cdp = Cdp(os.path.join(tmp, "cdp-charts"))
    try:
        cdp.open(srv.url + "/")
        check(
            cdp.wait_for(
                "typeof renderCharts === 'function' && "
                "!!document.getElementById('chart-rate')"
            ),
            "the page did not load",
        )
        got = {
            name: cdp.eval(
                CHARTS_JS
                % json.dumps({"step_s": step, "now": now, "points": p})
            )
            for name, p in cases
        }
    finally:
        cdp.close()
    h, r = got["lookups late"]["chart-hits"], got["lookups late"]["chart-rate"]
    check(
        h["ticks"][0] == r["ticks"][0] == "-20 min",
        "the charts' time axes differ: %s, %s" % (h["ticks"], r["ticks"]),
    )
    check(h["lastX"] == r["lastX"], "the last slot is drawn at two places")
    for name in ("idle", "empty"):
        for cid, c in got[name].items():
            check(
                c["empty"] and not c["line"] and len(c["ticks"]) == 2,
                "%s history, %s: %s (want no data yet)" % (name, cid, c),
            )


def run_token_case(tmp, kcache_bin, demo_manifest):
    toks, tokfile = kcharness.make_tokens(
        tmp, ("read", "admin"), {"read": "page-read", "admin": "page-admin"}
    )
    srv = Server(
        "--tokens", tokfile, data_dir=os.path.join(tmp, "authed"), resp=False
    ).start()
    try:
        # admin can write: its warm stores the manifest too
        # for archs other than the manifest's: the matrix says so
        r = kcache(
            kcache_bin,
            tmp,
            "warm",
            demo_manifest,
            "--url",
            srv.url,
            "--cache-dir",
            os.path.join(tmp, "cache-authed"),
            "--arch",
            "sm_86,sm_80",
            token=toks["admin"],
        )
        check(r.returncode == 0, "authed warm: " + r.stdout + r.stderr)
        # no token: the page asks for one
        root = parse(dump_dom(srv.url + "/"))
        login = root.find("section", id="login")
        check(
            login is not None and "hidden" not in login.attrs,
            "the page does not ask for a token",
        )
        check(
            "hidden" in root.find("main", id="main").attrs,
            "data shown without a token",
        )
        check(root.find("input", id="token-input") is not None, "no input")
        for role, purge in (("read", False), ("admin", True)):
            cdp = Cdp(os.path.join(tmp, "cdp-" + role))
            try:
                cdp.open(srv.url + "/")
                check(
                    cdp.wait_for("!document.getElementById('login').hidden"),
                    "no token prompt (%s)" % role,
                )
                # typed into the page's own form, as a person would
                cdp.eval(
                    "document.getElementById('token-input').value = %s;"
                    "document.getElementById('token-form')"
                    ".requestSubmit(); true" % json.dumps(toks[role])
                )
                check(
                    cdp.wait_for(
                        "document.querySelectorAll('#models tr[data-model]')"
                        ".length > 0"
                    ),
                    "no models with the %s token" % role,
                )
                check(
                    cdp.wait_for(
                        "document.getElementById("
                        "'matrix-summary').dataset.archsFrom"
                    ),
                    "no coverage matrix (%s)" % role,
                )
                dom = cdp.eval("document.documentElement.outerHTML")
                href = cdp.eval("location.href")
                kept = cdp.eval("sessionStorage.getItem('kcache.token')")
                if purge:
                    check_purge_confirm(cdp, srv, toks["admin"])
            finally:
                cdp.close()
            root = parse(dom)
            summary = root.find("p", id="matrix-summary")
            check(
                summary.attrs.get("data-archs-from") == "warm"
                and "those its warms ran for (--arch), the manifest lists "
                "sm_80, sm_89, sm_90a"
                in summary.all_text(),
                "the matrix does not say its archs are the warm's: %r"
                % summary.all_text(),
            )
            who = root.find("span", id="who").all_text()
            check("role " + role in who, "role line %r" % who)
            has = any(b.has_class("purge") for b in root.find_all("button"))
            check(
                "hidden" in root.find("section", id="families-section").attrs,
                "a RESP key families table without --resp-listen",
            )
            check(
                has == purge,
                "%s token: purge button %s"
                % (role, "missing" if purge else "offered"),
            )
            check(
                toks[role] not in href and toks[role] not in dom,
                "the token shows in the URL or the DOM",
            )
            check(kept == toks[role], "the token is not in sessionStorage")
    finally:
        srv.stop()
    log = srv.log_text()
    check(all(t not in log for t in toks.values()), "a token in the log")


def main():
    if len(sys.argv) != 4:
        print(__doc__, file=sys.stderr)
        return 2
    kcached, kcache_bin, artifacts = sys.argv[1:]
    kcharness.KCACHED = os.path.abspath(kcached)
    if not CHROMIUM:
        kcharness.missing("no chromium")
    os.makedirs(artifacts, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix="kcache-page-")
    srv = None
    try:
        srv = Server(data_dir=os.path.join(tmp, "open")).start()
        resp_reads(srv.port)
        demo, evil = model_hash("demo"), model_hash("evil")
        wd = warmup(
            tmp,
            "demo-mlp",
            demo,
            ["sm_80", "sm_89", "sm_90a"],
            [1, 8, 32],
            failing="([ {batch} = 32 ] && [ {arch} = sm_89 ]) || "
            "([ {batch} = 8 ] && [ {arch} = sm_80 ])",
        )
        we = warmup(
            tmp,
            "<img src=x onerror=alert(1)>",
            evil,
            ["sm_89", "sm_90a"],
            [1, 8],
        )
        for w in (wd, we):
            r = kcache(kcache_bin, tmp, "warm", w, "--url", srv.url)
            check(r.returncode == 0, "warm: " + r.stdout + r.stderr)
        # one missing cell gets a builder's lease: shown as building
        r = kcache(
            kcache_bin,
            tmp,
            "warm",
            wd,
            "--url",
            srv.url,
            "--json",
            "--no-build",
            "--cache-dir",
            os.path.join(tmp, "c2"),
        )
        failed = [
            i["key"]
            for i in json.loads(r.stdout)["items"]
            if i["status"] == "failed"
        ]
        check(len(failed) == 2, "two cells of demo fail to build")
        srv.api(
            "/v1/leases/" + failed[0],
            "POST",
            json.dumps({"holder": "ci-runner-7"}).encode(),
        )
        for _ in range(3):  # hits
            kcache(
                kcache_bin,
                tmp,
                "warm",
                wd,
                "--url",
                srv.url,
                "--no-build",
                "--cache-dir",
                os.path.join(tmp, "c3"),
            )
        time.sleep(1.5)  # last uses and hits are flushed once a second
        url = srv.url + "/#" + demo
        root = parse(dump_dom(url))
        check_open_page(root, srv, demo, evil)
        check_families(root, srv)
        states = check_matrix(root, srv, demo)
        check(
            states == {"present": 7, "missing": 1, "building": 1},
            "cell states %s" % states,
        )
        shot = os.path.join(artifacts, "page.png")
        screenshot(url, shot)
        print("screenshot: " + shot)
        check_charts(tmp, srv)
        run_token_case(tmp, kcache_bin, wd)
    finally:
        if srv:
            srv.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    print("page: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
