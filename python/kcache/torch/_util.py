"""kcache.torch._util: what every path of kcache.torch shares: the client
made from the arguments or the environment, and a call bounded by the
service's deadline."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable, Dict, Optional, Tuple

from ..client import Client


def _client(
    client: Optional[Client],
    url: Optional[str],
    token: Optional[str],
    deadline: float,
) -> Optional[Client]:
    if client is not None:
        return client
    url = url or os.environ.get("KCACHE_URL")
    if not url:
        return None
    t = max(1.0, float(deadline))
    return Client(url=url, token=token, timeout=t, connect_timeout=min(2.0, t))


def _bounded(fn: Callable[[], Any], deadline: float) -> Tuple[bool, Any]:
    """Runs fn on a worker thread for at most deadline seconds: (done,
    result or exception). Past the deadline the worker is left to finish
    (its result is dropped), and the caller goes on."""
    box: Dict[str, Any] = {}

    def run() -> None:
        try:
            box["r"] = fn()
        except BaseException as e:  # handed to the caller, never raised there
            box["e"] = e

    t = threading.Thread(target=run, name="kcache-fetch", daemon=True)
    t.start()
    t.join(max(0.0, deadline))
    if t.is_alive():
        return False, None
    return True, box.get("e", box.get("r"))
