"""conftest: a real kcached per test module (tests/kcharness.py through
kcserver.start_kcached; its log's tail is printed when one of the module's
tests failed), and the rule for missing packages: a test that needs torch
(or triton, redis-py) fails when CI=true and is skipped otherwise."""

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


def _serve(request, s):
    failed = request.session.testsfailed
    try:
        yield s
    finally:
        if request.session.testsfailed > failed:
            tr = request.config.pluginmanager.get_plugin("terminalreporter")
            if tr:
                tr.write_line("\n" + s.log_tail())
        s.cleanup()


@pytest.fixture(scope="module")
def server(request):
    yield from _serve(request, kcserver.start_kcached())


@pytest.fixture(scope="module")
def auth_server(request):
    """kcached with --tokens: read, write and admin tokens in .tokens."""
    yield from _serve(request, kcserver.start_kcached(tokens=True))


@pytest.fixture
def dead_url():
    """A loopback port nothing listens on."""
    return "http://127.0.0.1:%d" % kcserver.free_port()
