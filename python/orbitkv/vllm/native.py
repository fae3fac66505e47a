"""Lazy access to `orbitkv._native` (contract O4: nothing native starts on import).

The native module is imported the first time a role actually talks to the Manager.
`ManagerSession` owns one `Client` and the namespaces registered through it.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

from orbitkv.engine.session import ReconnectBackoff, connection_lost, is_error, native, not_connected
from orbitkv.vllm.config import OrbitKVSettings

if TYPE_CHECKING:
    from orbitkv._native import Client, Lease, Namespace, PageLayout, TpLease
    from orbitkv.vllm.layout import BlockGeometry

logger = logging.getLogger("orbitkv.vllm")

__all__ = ["ManagerSession", "is_error", "native", "page_layout"]


class ManagerSession:
    """One lazily opened Manager session plus the namespaces it registered.

    Thread-safe for the calls the adapter makes (the native client releases the GIL;
    registration is serialised here so two threads never register the same key twice).
    """

    def __init__(
        self,
        settings: OrbitKVSettings,
        fingerprint: bytes,
        block_bytes: int,
        *,
        map_arena: bool = True,
        timeout_ms: int | None = None,
        shard: int = 0,
        shards: int = 1,
        prefault_loader: bool = True,
    ) -> None:
        self.settings = settings
        self.map_arena = map_arena
        self.prefault_loader = prefault_loader
        self.timeout_ms = settings.timeout_ms if timeout_ms is None else timeout_ms
        self.fingerprint = fingerprint
        self.block_bytes = block_bytes
        # This role's KV shard (a worker's TP rank) and the TP size: the scheduler
        # names every shard in its TP lookups (see orbitkv.vllm.tp).
        self.shard = shard
        self.shards = shards
        self._client: Client | None = None
        self._namespaces: dict[bytes, Namespace] = {}
        self._shard_namespaces: dict[bytes, list[Namespace]] = {}
        self._lock = threading.Lock()
        # After a broken or refused connection, calls fail fast until the back-off ends.
        self._backoff = ReconnectBackoff(logger)
        self._attempted = False  # the first connection attempt was made (inline)
        self._connecting: threading.Thread | None = None  # a background attempt runs
        self._closed = False
        # A second connection for the loads' calls (see `loader`), with its namespaces.
        self._loader: Client | None = None
        self._loader_namespaces: dict[bytes, Namespace] = {}
        self._loader_lock = threading.Lock()

    @property
    def connected(self) -> bool:
        return self._client is not None

    @property
    def reconnecting(self) -> bool:
        """A connection attempt runs in the background."""
        return self._connecting is not None

    def client(self) -> Client:
        """The session's client. The first connection is made here (at start-up: the
        Manager is asked once before serving). Every later one (after a lost connection or
        a failed attempt) is made on a background thread: a Manager that accepts but does
        not answer (stopped, overloaded) would otherwise hold the calling engine step for
        the whole call timeout at every back-off period. Meanwhile calls fail at once with
        `ManagerUnavailable` (`not_connected`: a miss, or a save not made)."""
        with self._lock:
            if self._client is not None:
                return self._client
            if self._connecting is not None:
                raise not_connected("reconnecting to the Manager in the background")
            wait = self._backoff.wait_left()
            if wait > 0:
                raise not_connected(f"Manager unreachable; next connection attempt in {wait:.2f}s")
            if self._attempted:
                self._connecting = threading.Thread(
                    target=self._connect_in_background, name="orbitkv-reconnect", daemon=True
                )
                self._connecting.start()
                raise not_connected("reconnecting to the Manager in the background")
            self._attempted = True
            try:
                self._client = self._connect()
            except Exception as exc:
                self._backoff.failed(exc)
                raise
            self._backoff.succeeded()
            logger.info("orbitkv: connected to Manager at %s", self._client.socket_path)
            return self._client

    def _connect(self, prefault: bool = True) -> Client:
        return native().Client(
            self.settings.socket_path,
            token=self.settings.token,
            timeout_ms=self.timeout_ms,
            map_arena=self.map_arena,
            prefault=prefault,
        )

    def _connect_in_background(self) -> None:
        try:
            client: Client | None = self._connect()
            failure: BaseException | None = None
        except Exception as exc:
            client, failure = None, exc
        with self._lock:
            self._connecting = None
            if client is not None and not self._closed:
                self._client = client
                self._backoff.succeeded()
                client = None
            elif failure is not None:
                self._backoff.failed(failure)
        if client is not None:  # the session was closed meanwhile
            client.close()
        elif failure is None:
            logger.info("orbitkv: reconnected to the Manager at %s", self.settings.socket_path)

    def loader(self) -> Client:
        """The connection a worker's loads use (lookup or redeem, acquire, restore and the
        lease's release), beside `client()`, which the engine step's calls use (saves). A
        connection serves one call at a time, and an `acquire` answers only once its blocks
        are staged (from SSD: tens of ms to seconds): on one shared connection every save
        call of the step would wait behind it (`benches/step_calls_under_load.py`). Made on
        first use, on the calling (pool) thread, once `client()` is connected; it maps the
        arena like the main connection (a data session: its leases are quarantined, not
        released, if it drops while a copy may still read them), with `prefault_loader`
        deciding whether its page tables are filled (not when the copies go through the
        main connection's pinned mapping). Dropped with the main connection."""
        main = self.client()
        # Pool threads wait for one another's connect here; the step never takes this lock.
        with self._loader_lock:
            with self._lock:
                if self._loader is not None:
                    return self._loader
            loader = self._connect(prefault=self.prefault_loader)
            with self._lock:
                if self._client is main and not self._closed:
                    self._loader, self._loader_namespaces = loader, {}
                    return loader
        loader.close()  # the main connection was dropped meanwhile
        raise not_connected("the Manager connection was dropped while the loads' connection was made")

    def loader_namespace(self, salt: bytes) -> Namespace:
        """`namespace(salt)` registered through the loads' connection (serialised by the
        loads' lock: a registration waiting behind an acquire never holds up the step)."""
        loader = self.loader()
        with self._lock:
            # The cache of this loader: a new one replaces it whenever the loader changes,
            # so a registration finishing after a drop lands in a cache no one reads.
            cache = self._loader_namespaces if self._loader is loader else {}
        return self._registered(loader, cache, salt, self._loader_lock)

    def namespace(self, salt: bytes) -> Namespace:
        return self._registered(self.client(), self._namespaces, salt, self._lock)

    def _registered(
        self, client: Client, cache: dict[bytes, Namespace], salt: bytes, lock: threading.Lock
    ) -> Namespace:
        """`salt`'s namespace through `client`, registered once: two threads never register
        the same key twice."""
        with lock:
            ns = cache.get(salt)
            if ns is None:
                ns = client.register_namespace(self.fingerprint, self.block_bytes, shard=self.shard, salt=salt)
                cache[salt] = ns
            return ns

    def shard_namespaces(self, salt: bytes) -> list[Namespace]:
        """The namespaces of shards 0..shards-1 for `salt` (a TP lookup's targets)."""
        client = self.client()
        with self._lock:
            nss = self._shard_namespaces.get(salt)
            if nss is None:
                nss = [
                    client.register_namespace(self.fingerprint, self.block_bytes, shard=r, salt=salt)
                    for r in range(self.shards)
                ]
                self._shard_namespaces[salt] = nss
            return nss

    def reset_generation(self) -> int:
        """Move this fingerprint (every salt) to a fresh generation.

        Runs over a short-lived control-only connection with the workers' timeout
        (`timeout_ms`), not this session's: a reset waits for the Manager to persist
        the new generation (an fsync with the SSD tier on), which the scheduler's
        short timeout must not cut off into a reset reported failed that took effect.
        """
        mod = native()
        with mod.Client(
            self.settings.socket_path, token=self.settings.token, timeout_ms=self.settings.timeout_ms, map_arena=False
        ) as c:
            ns = c.register_namespace(self.fingerprint, self.block_bytes, shard=0, salt=b"")
            return int(c.reset_generation(ns))

    def namespaces(self) -> dict[bytes, Namespace]:
        with self._lock:
            return dict(self._namespaces)

    def forget_namespaces(self) -> None:
        """Drop cached handles so the next use re-registers (after a generation reset)."""
        with self._lock:
            self._namespaces.clear()
            self._shard_namespaces.clear()
            self._loader_namespaces = {}

    def release(self, lease: Lease | TpLease) -> bool:
        """Release `lease` through the client that holds it. False when that client's
        session is gone (dropped connection): the Manager already released the lease
        with it (a never-acquired lease is not quarantined), so there is nothing to do
        and no reason to disturb the current connection."""
        with self._lock:
            held_by = [c for c in (self._client, self._loader) if c is not None and c.session_id == lease.session]
        if not held_by:
            return False
        client = held_by[0]
        from orbitkv import _native  # loaded already: `client` is one of its Clients

        if isinstance(lease, _native.TpLease):
            client.release_tp(lease)  # parts no rank redeemed are released
        else:
            client.release(lease, wait=False)  # no round trip on the scheduler thread
        return True

    def drop_if_broken(self, exc: BaseException) -> bool:
        """Drop the connection when `exc` says it is gone (the Manager died, restarted or
        broke the protocol), so that the next call reconnects (L7). True when dropped."""
        if connection_lost(exc):
            self.drop_client()
            return True
        return False

    def drop_client(self) -> None:
        """Forget a broken connection (and the loads' connection with it); the next call
        reconnects."""
        with self._lock:
            clients = [self._client, self._loader]
            self._client = self._loader = None
            self._namespaces.clear()
            self._shard_namespaces.clear()
            self._loader_namespaces = {}
        for client in clients:
            if client is not None:
                try:
                    client.close()
                except Exception:
                    logger.debug("orbitkv: closing a broken session failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            self._closed = True
        self.drop_client()


def page_layout(geometry: BlockGeometry, region_bytes: int) -> PageLayout:
    """The native page layout of `geometry` over a KV region of `region_bytes`: the
    client's page gather/scatter (`save_pages`/`restore_pages`) checks every page of
    every block against the region and every arena slot against its mapping."""
    pages = []
    for p in geometry.pages:
        if len(p.shape) != 4 or len(p.strides) != 4:
            raise ValueError(f"layer {p.layer!r}: expected a 4-dim page, got shape {p.shape}")
        pages.append((p.base, p.block_stride, (*p.shape,), (*p.strides,)))
    layout: PageLayout = native().PageLayout(pages, geometry.num_blocks, region_bytes)
    if layout.block_bytes != geometry.block_bytes:
        raise ValueError(
            f"native page layout holds {layout.block_bytes} bytes per block, the geometry {geometry.block_bytes}"
        )
    return layout
