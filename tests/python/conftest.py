"""conftest: a real kcached per test module (kcserver.Kcached), and the rule
for missing packages: a test that needs torch (or triton, redis-py) fails
when CI=true and is skipped otherwise."""
import importlib
import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kcserver  # noqa: E402


def need(module):
    """Imports module, or fails (CI=true) / skips the test without it."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        if os.environ.get("CI") == "true":
            pytest.fail("%s is required when CI=true: %s" % (module, e))
        pytest.skip("%s not installed" % module)


@pytest.fixture(scope="module")
def server():
    s = kcserver.Kcached().start()
    yield s
    s.cleanup()


@pytest.fixture(scope="module")
def auth_server():
    """kcached with --tokens: read, write and admin tokens in .tokens."""
    s = kcserver.Kcached(tokens=True).start()
    yield s
    s.cleanup()


@pytest.fixture
def dead_url():
    """A loopback port nothing listens on."""
    return "http://127.0.0.1:%d" % kcserver.free_port()
