"""The SGLang linker's Manager sessions: one connection with its namespace, arena view
and copy engine (`Session`), and a reconnection made on a background thread
(`Reconnect`)."""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any

from orbitkv.sglang.config import SGLangSettings

if TYPE_CHECKING:
    from orbitkv.sglang._shared import PoolGeometry

logger = logging.getLogger("orbitkv.sglang")


class Session:
    """One Manager connection: client, namespace, arena view and copy engine. Kept open
    while any lease, load or save refers to its arena mapping, even after it broke."""

    def __init__(
        self, settings: SGLangSettings, fingerprint: bytes, geometry: PoolGeometry, client: Any = None
    ) -> None:
        from orbitkv import _native
        from orbitkv.kvcopy import ArenaView, CopyEngine

        self.native = _native
        # `client`: one connected already (by the background attempt), else connect here.
        self.client = connect_client(settings) if client is None else client
        try:
            self.ns = self.client.register_namespace(fingerprint, geometry.block_bytes)
            device = geometry.layers[0].backing.device
            self.arena = ArenaView(self.client, device)
            self.engine = CopyEngine(geometry.layers, self.arena)
        except BaseException:
            self.client.close()
            raise
        self.broken = False
        self.users = 0  # queries, loads and offloads referring to this arena

    def close(self) -> None:
        try:
            self.engine.drain()
        finally:
            self.arena.close()
            try:
                self.client.close()
            except Exception:
                logger.debug("orbitkv: closing a broken Manager session failed", exc_info=True)


def connect_client(settings: SGLangSettings) -> Any:
    from orbitkv import _native

    return _native.Client(settings.socket_path, token=settings.token, timeout_ms=settings.timeout_ms)


class Reconnect:
    """One connection attempt on a background thread: a Manager that accepts but does not
    answer (stopped, overloaded) holds it for `timeout_ms`, not the scheduler step."""

    def __init__(self, settings: SGLangSettings) -> None:
        self.result: Any = None  # the connected client, or the exception
        self._lock = threading.Lock()
        self._abandoned = False
        self._thread = threading.Thread(target=self._run, args=(settings,), name="orbitkv-reconnect", daemon=True)
        self._thread.start()

    def _run(self, settings: SGLangSettings) -> None:
        try:
            client = connect_client(settings)
        except Exception as exc:
            with self._lock:
                self.result = exc
            return
        with self._lock:
            if not self._abandoned:
                self.result = client
                return
        client.close()

    def done(self) -> bool:
        self._thread.join(0)
        return not self._thread.is_alive()

    def abandon(self) -> None:
        """Close the client this attempt made or will make (the linker closes)."""
        with self._lock:
            self._abandoned = True
            client, self.result = self.result, None
        if client is not None and not isinstance(client, BaseException):
            client.close()
