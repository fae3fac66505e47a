"""Type stubs for the native module `orbitkv._native` (PyO3, Rust).

Every call that talks to the Manager or copies bytes releases the GIL.
Buffers: any object exporting the Python buffer protocol (bytes for sources,
bytearray / memoryview / numpy arrays for destinations), or a contiguous CPU
torch tensor. Sizes must match exactly: one buffer of exactly `n * block_bytes`
bytes, or a sequence of exactly `n` buffers of `block_bytes` each; anything else
(one byte more, one buffer more) is a `ValueError` naming expected and actual.
A buffer must not overlap the client's arena mapping (`ValueError`), and must not
be written by anyone else while a call copies into or out of it.
"""

from collections.abc import Sequence
from typing import Any, final

from typing_extensions import Buffer

PROTOCOL_VERSION: int
HASH_BYTES: int  # 32: every block hash is exactly 32 bytes

__all__ = [
    "HASH_BYTES",
    "PROTOCOL_VERSION",
    "AuthError",
    "Busy",
    "Client",
    "Lease",
    "ManagerUnavailable",
    "Namespace",
    "OrbitKVError",
    "PageLayout",
    "PendingLookup",
    "PendingSave",
    "ProtocolError",
    "RestoreFailed",
    "SaveFailed",
    "SaveResult",
    "TpLease",
    "__version__",
    "default_socket_path",
    "namespace_salt",
    "serve",
]

__version__: str

class OrbitKVError(Exception):
    """Base error of the native client. `.code` names the failure class."""

class ManagerUnavailable(OrbitKVError):
    """No Manager listens on the socket, or the connection broke."""

class AuthError(OrbitKVError):
    """The Manager refused this peer (uid not allowed or token wrong), or the
    process answering on the socket runs as an untrusted uid (message ending
    in "[untrusted_server]"; nothing, the token included, was sent to it)."""

class ProtocolError(OrbitKVError):
    """Malformed or unexpected frame; the session is closed."""

class Busy(OrbitKVError):
    """Refused because owners are still live (e.g. generation reset)."""

class SaveFailed(OrbitKVError):
    """A save failed (e.g. an injected commit fault); nothing of it became
    visible and its slots were freed. Saves are best effort: lose the entry,
    never the request."""

class RestoreFailed(OrbitKVError):
    """The Manager could not stage the leased blocks (tier error or injected
    fault). The lease is released; treat as a load failure."""

@final
class Namespace:
    @property
    def id(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def fingerprint(self) -> bytes: ...
    @property
    def shard(self) -> int: ...

@final
class Lease:
    """Pins `hit_blocks` blocks (the longest contiguous prefix hit) until
    released. Releasing twice is a no-op; `with client.lookup(...) as lease:`
    releases on exit."""

    @property
    def id(self) -> int: ...
    @property
    def hit_blocks(self) -> int: ...
    @property
    def ssd_blocks(self) -> list[int]: ...  # indices of hit blocks on SSD only at lookup (staged by acquire)
    @property
    def block_bytes(self) -> int: ...
    @property
    def session(self) -> int: ...  # Client.session_id of the client that holds it
    @property
    def released(self) -> bool: ...
    def __enter__(self) -> Lease: ...
    def __exit__(self, *exc: object) -> None:
        """Releases the lease (a no-op when already released)."""

@final
class TpLease:
    """A TP lease (contract T1): the common prefix of every declared shard,
    pinned in each until every rank's worker reported done (released its
    redeemed part) or the owner calls `Client.release_tp`. `token` is the
    capability the rank workers redeem with `Client.redeem_tp`."""

    @property
    def token(self) -> bytes: ...  # 16 bytes; all zeros when hit_blocks == 0
    @property
    def hit_blocks(self) -> int: ...
    @property
    def generation(self) -> int: ...
    @property
    def ssd_blocks(self) -> list[int]: ...  # indices of hit blocks some shard held on SSD only at lookup
    @property
    def session(self) -> int: ...  # Client.session_id of the owner
    @property
    def released(self) -> bool: ...

@final
class SaveResult:
    @property
    def stored(self) -> int: ...  # newly committed blocks
    @property
    def already_present(self) -> int: ...  # skipped: an equal key was visible
    @property
    def refused(self) -> int: ...  # admission said no (arena full of pinned blocks)
    @property
    def bytes_copied(self) -> int: ...

@final
class PendingSave:
    """Slots allocated for a save; invisible until `Client.commit_save`.
    `with client.begin_save(...) as pending:` aborts it on exit unless committed."""

    @property
    def id(self) -> int: ...
    @property
    def slots(self) -> list[tuple[int, int] | None]: ...  # (segment, offset) or None when skipped
    @property
    def packed_slots(self) -> bytes: ...  # little-endian int64 (segment, offset) pairs; (-1, -1) when skipped
    @property
    def statuses(self) -> list[str]: ...  # "allocated" | "present" | "refused"
    @property
    def done(self) -> bool: ...  # committed or aborted
    def __enter__(self) -> PendingSave: ...
    def __exit__(self, *exc: object) -> None:
        """Aborts the save unless it was committed (a no-op when done)."""

@final
class PendingLookup:
    def done(self) -> bool: ...  # the Manager answered, or the lookup failed
    def wait(self, timeout_s: float) -> bool: ...  # done within timeout_s (GIL released); ValueError if < 0
    def result(self) -> Lease: ...  # waits (GIL released); raises the lookup's error; once

@final
class Client:
    def __new__(
        cls,
        socket_path: str | None = None,
        *,
        token: str | None = None,
        timeout_ms: int = 5000,  # must be > 0 (ValueError)
        map_arena: bool = True,  # False: control-only, no copies (e.g. an engine scheduler)
        server_uid: int | None = None,  # also trust a Manager of this uid (default: $ORBITKV_SERVER_UID)
        prefault: bool = True,  # False: the mapped arena's page tables are not filled in the background
    ) -> Client: ...
    @property
    def session_id(self) -> int: ...
    @property
    def control_only(self) -> bool: ...
    @property
    def socket_path(self) -> str: ...
    def segments(self) -> list[tuple[int, int]]: ...  # (segment id, size in bytes)
    def segment_address(self, segment: int) -> tuple[int, int]:
        """(address, size) of a mapped arena segment in this process, for GPU
        registration and gather/scatter kernels. Copies made through it are the
        caller's to drain (stream synchronise) before `release`/`commit_save`/`close`.
        An unknown segment is a `ValueError`."""
    def register_namespace(
        self,
        fingerprint: bytes,
        block_bytes: int,
        *,
        shard: int = 0,
        salt: bytes = ...,  # default b"": no salt; any length, encoded by `namespace_salt`
    ) -> Namespace: ...
    @property
    def has_presence(self) -> bool: ...  # the Manager publishes a presence table (--presence-slots)
    def probably_present(self, ns: Namespace, hashes: Sequence[bytes]) -> int:
        """Length of the prefix of `hashes` that may be present in `ns`, read from the
        Manager's shared presence table with no message (0: the first block is certainly
        absent; hashes after the first absent one are not examined). Promises nothing for
        a non-zero answer: only `lookup` pins. `len(hashes)` without a table; raises
        `ManagerUnavailable` once the Manager closed or died."""
    def lookup(self, ns: Namespace, hashes: Sequence[bytes]) -> Lease: ...
    def start_lookup(self, ns: Namespace, hashes: Sequence[bytes]) -> PendingLookup:
        """`lookup` on this client's background thread (no Python code runs there, so it
        needs no GIL); returns at once."""
    def lookup_tp(self, namespaces: Sequence[Namespace], hashes: Sequence[bytes]) -> TpLease: ...
    def redeem_tp(self, token: bytes, ns: Namespace) -> Lease: ...  # this shard's part, as a Lease of this client
    def release_tp(self, lease: TpLease) -> bool: ...  # owner only; False: it had ended already (or a repeat)
    def acquire(self, lease: Lease) -> list[tuple[int, int]]: ...  # stage + (segment, offset) per hit block
    def acquire_packed(self, lease: Lease) -> bytes: ...  # acquire, as little-endian int64 (segment, offset) pairs
    def restore(
        self,
        lease: Lease,
        dst: Buffer | Sequence[Buffer],
        *,
        start: int = 0,
        count: int | None = None,
    ) -> int: ...  # bytes copied
    def release(self, lease: Lease, *, wait: bool = True) -> None:
        """Release `lease` (a no-op when already released). `wait=False` sends it
        without waiting for the Manager (one message, no round trip); later
        requests of this client see it released, and a lease the Manager no
        longer knows is counted there (`quiet_release_failures_total`), not raised."""
    def release_later(self, lease: Lease) -> None:
        """Release `lease` (a no-op when already released) with neither a round
        trip nor a message of its own: the release is written in front of this
        client's next request, or by the client's flusher thread once it has
        waited `ORBITKV_RELEASE_DELAY_US` (default 200; 0 sends at once). Later
        requests of this client see it released; other processes may see it
        held for up to that delay, so use it only where no other process waits
        on the release (a scheduler's query leases, not a worker's load lease
        that its engine's report must follow)."""
    def save(self, ns: Namespace, hashes: Sequence[bytes], src: Buffer | Sequence[Buffer]) -> SaveResult: ...
    def begin_save(self, ns: Namespace, hashes: Sequence[bytes]) -> PendingSave: ...
    def commit_save(self, pending: PendingSave) -> int: ...
    def abort_save(self, pending: PendingSave) -> None: ...
    def reset_generation(self, ns: Namespace) -> int: ...
    def retain(
        self,
        ns: Namespace,
        hashes: Sequence[bytes],
        *,
        keep_for_s: float | None = None,
        done: bool = False,
        clear: bool = False,
    ) -> tuple[int, int, int]:
        """A retention hint on a chain of blocks (prefix first): exactly one of
        `keep_for_s` (expected back within that many seconds, 0.001 to 86400), `done`
        (not expected back: they leave first) or `clear` (forget earlier hints).
        Returns (applied, pending, refused): blocks it applied to, blocks not committed
        yet (they take it when they commit), blocks the Manager's cap refused. Raises
        ValueError for a bad argument, and when the Manager runs with
        `--retain-share 0` (hints off)."""
    def inject_faults(self, *, restore_failures: int = 0, commit_failures: int = 0) -> None: ...
    def stats(self) -> dict[str, Any]: ...
    def trace(
        self, arm_ms: int, *, fingerprint: bytes | None = None, pid: int = 0, cursor: int = ...
    ) -> dict[str, Any]:
        """Arms the Manager's trace for `arm_ms` more ms (0 stops it), filtered by namespace
        `fingerprint` and `pid`; returns {"events": [...], "next": cursor, "missed": n, ...}
        with the events after `cursor` (default: from now on). See `orbitkv trace`."""
    def close(self) -> None:
        """Waits for this client's host copies in flight, then tells the Manager
        to release every lease and pending save of the session. Idempotent."""
    def __enter__(self) -> Client: ...
    def __exit__(self, *exc: object) -> None: ...
    def restore_pages(
        self,
        lease: Lease,
        layout: PageLayout,
        kv: Buffer,
        block_ids: Sequence[int],
        *,
        start: int = 0,
    ) -> int:
        """Scatter hit blocks `[start, start + len(block_ids))` of `lease` (acquired
        first if needed) into the engine pages of `block_ids` inside `kv`, a writable
        buffer of exactly `layout.region_bytes`. Every page and arena range is
        bounds-checked; the copy holds the client's copy lock, so `close` waits
        for it. Returns the bytes copied."""
    def save_pages(self, pending: PendingSave, layout: PageLayout, kv: Buffer, block_ids: Sequence[int]) -> int:
        """Gather the engine pages of `block_ids` (exactly one per hash of `pending`)
        from `kv` into the save's allocated slots; present/refused blocks are
        skipped. Commit or abort afterwards. Returns the bytes copied."""

@final
class PageLayout:
    """The block geometry of one engine KV region: per layer, block `b`'s page starts
    at `base + b * block_stride` and has a 4-dim `shape` with byte `strides`
    (innermost stride 1). A cached block is its pages concatenated in the given
    order, each in physical byte order when dense, else in logical order. Every
    page of every block is checked to lie inside `region_bytes`."""

    def __new__(
        cls,
        pages: Sequence[tuple[int, int, tuple[int, int, int, int], tuple[int, int, int, int]]],
        num_blocks: int,
        region_bytes: int,
    ) -> PageLayout: ...
    @property
    def block_bytes(self) -> int: ...
    @property
    def num_blocks(self) -> int: ...
    @property
    def region_bytes(self) -> int: ...

def namespace_salt(salt: bytes) -> bytes:
    """The 32 bytes the Manager keys a tenant salt by: zeros for b"", else SHA-256 of
    a domain tag and the salt. The one encoding every client (Rust or Python) uses."""

def serve(argv: Sequence[str]) -> int: ...
def default_socket_path() -> str: ...
