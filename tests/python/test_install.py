"""test_install: the kcache that `pip install ./python` (scripts/pyenv.sh)
put into the environment imports from site-packages with the libkcache.so
it carries: no LD_LIBRARY_PATH, no KCACHE_LIB, no source tree on the path."""

import os
import subprocess
import sys


def test_installed_package_carries_its_library(tmp_path):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "KCACHE_LIB", "LD_LIBRARY_PATH")
    }
    code = (
        "import kcache, os; print(kcache.LIB_PATH); "
        "print(os.path.dirname(kcache.__file__)); "
        "print(kcache.key({'model':'a'*64,'build':'b'*64,'arch':'sm_90',"
        "'bucket':{'n':1},'toolchain':{}}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        cwd=str(tmp_path),
        env=env,
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stderr
    lib, pkg, key = out.stdout.split()
    assert "site-packages" in pkg, pkg
    assert lib == os.path.join(pkg, "libkcache.so")
    assert len(key) == 64
    assert os.path.exists(os.path.join(pkg, "py.typed"))
