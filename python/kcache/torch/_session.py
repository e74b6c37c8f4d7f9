"""kcache.torch._session: what kcache.torch's sessions share (warm()'s
Warm, CacheDirBundle, MegaCache): the keywords that say which model, which
kcached and how long to wait; the client made from them; `stats`; and the
protocol: load before the compile, save after, never raising into the
service. A session is its own context manager:

    with MegaCache(model) as mc:   # load()
        compiled(x)
    # save(), also when the body raised; mc.stats says what happened
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, Mapping, Optional, Tuple, TypeVar

from ..client import Client
from ._util import _bounded, _client

log = logging.getLogger("kcache.torch")

_S = TypeVar("_S", bound="_Session")


class _Session:
    """model: a module or a name (keys.model_hash). client, or url/token
    (default KCACHE_URL/KCACHE_TOKEN; neither: no server, compile
    locally). device and options: what else goes in the keys. deadline:
    seconds the fetch, and the wait for the upload, may take. upload:
    False never writes. lease_ttl: seconds an upload's lease holds.

    Subclasses give _new_stats, _load, _save and _failed; load() and
    save() never raise (what failed goes in `stats` through _failed)."""

    def __init__(
        self,
        model: Any,
        client: Optional[Client] = None,
        *,
        url: Optional[str] = None,
        token: Optional[str] = None,
        device: Optional[str] = None,
        options: Optional[Mapping[str, Any]] = None,
        deadline: float = 10.0,
        upload: bool = True,
        lease_ttl: int = 600,
    ):
        self.model = model
        self.device = device
        self.options: Dict[str, Any] = dict(options or {})
        self.deadline = float(deadline)
        self.upload_enabled = upload
        self.lease_ttl = lease_ttl
        self._client_args = (client, url, token)
        self._before: Dict[str, int] = {}  # counters() when loaded
        self.stats: Dict[str, Any] = self._new_stats()

    # ---- what a subclass gives ----
    def _new_stats(self) -> Dict[str, Any]:
        return {}

    def _load(self) -> None:
        pass

    def _save(self) -> None:
        pass

    def _failed(self, saving: bool, e: Exception) -> None:
        log.warning("kcache.torch: %s: %s", "save" if saving else "load", e)

    # ---- the protocol ----
    def load(self) -> None:
        """Before the compile: what kcached holds for the model, fetched
        within the deadline. Never raises."""
        try:
            self._load()
        except Exception as e:  # never into the service
            self._failed(False, e)

    def save(self) -> None:
        """After the compile: what this process compiled and kcached
        lacks, uploaded (waited for at most the deadline). Never raises."""
        try:
            self._save()
        except Exception as e:  # never into the service
            self._failed(True, e)

    def __enter__(self: _S) -> _S:
        self.load()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.save()

    # ---- shared steps ----
    def _client(self) -> Optional[Client]:
        """The client given, or one to url/KCACHE_URL whose timeouts fit
        the deadline; None when there is no server."""
        client, url, token = self._client_args
        return _client(client, url, token, self.deadline)

    def _within(
        self, fn: Callable[[], Any], left: Optional[float] = None
    ) -> Tuple[bool, Any]:
        """fn on a worker for at most left seconds (the deadline): (done,
        its result or exception); past it the service goes on."""
        return _bounded(fn, self.deadline if left is None else left)

    def _mark(self) -> None:
        """Torch's cache counters now: what _since counts from."""
        from . import counters

        self._before = counters()

    def _since(self, *keys: str) -> Dict[str, int]:
        """How much each of torch's cache counters grew since _mark."""
        from . import counters

        now = counters()
        return {k: now.get(k, 0) - self._before.get(k, 0) for k in keys}
