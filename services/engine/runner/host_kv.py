"""HostKVStore: the storage behind the host tier (prefix/host_tier.py): KV pages in pinned host
memory, and the copies a step's `KVTransfers` ask for.

    store = HostKVStore(kv, num_pages)
    store.run(step.transfers, model_stream)   # before the step's restores and forward

Layout: page-major, `[host pages, 2 x layers, page_size, kv_heads, head_dim]` (K of layer 0, V
of layer 0, K of layer 1 ...), so a run of consecutive host pages is one contiguous range and
one copy. On CUDA the memory is registered with the driver (`cudaHostRegister`: pinned, without
the caching host allocator's rounding up to a power of two), and the copies run on their own
stream in chunks of `staging_pages` through a device staging buffer:

- offload: gather the device pages of every layer into staging (`index_select`, then one
  stack), then one device-to-host copy per run of consecutive host pages;
- onload: one host-to-device copy per run into staging, then `index_copy_` into every layer.

The model stream waits for the copies' event before the step's forward. The copies need no
wait the other way: an offload reads pages of checkpoints that became ready (their writers
completed) and an onload writes pages whose last use completed (the pools' fences), so the
copies may overlap the step still running before this one. On the CPU the copies are plain
indexed assignments.
"""

from __future__ import annotations

import logging
import weakref

import torch

from services.common.errors import InternalError
from services.engine.model import KVCache
from services.engine.scheduler.plan import KVTransfers

log = logging.getLogger(__name__)

STAGING_PAGES = 64


def _runs(ids: list[int]) -> list[tuple[int, int, int]]:
    """(first id, first index, length) of each run of consecutive ids in `ids`."""
    runs: list[tuple[int, int, int]] = []
    for index, page in enumerate(ids):
        if runs and runs[-1][0] + runs[-1][2] == page:
            first, start, length = runs[-1]
            runs[-1] = (first, start, length + 1)
        else:
            runs.append((page, index, 1))
    return runs


def _raw(tensor: torch.Tensor) -> torch.Tensor:
    """Byte-sized dtypes (FP8 pages) move as uint8: every copy kernel supports it."""
    return tensor.view(torch.uint8) if tensor.element_size() == 1 and \
        tensor.dtype != torch.uint8 else tensor


def _unregister(store: torch.Tensor, stream: torch.cuda.Stream | None) -> None:
    """Waits for the copies in flight, then unpins `store`; after a device fault (a sticky
    error fails the wait) it unpins without waiting: nothing runs on that context again."""
    try:
        if stream is not None:
            stream.synchronize()
    except RuntimeError as exc:
        log.warning("the host KV tier's copy stream failed before unpinning: %s", exc)
    error = torch.cuda.cudart().cudaHostUnregister(store.data_ptr())
    if int(error) != 0:
        log.warning("unpinning the host KV tier failed (cudaHostUnregister error %s)", error)


class HostKVStore:
    def __init__(self, kv: KVCache, num_pages: int, *,
                 staging_pages: int = STAGING_PAGES) -> None:
        if num_pages < 1:
            raise InternalError("a host KV store needs at least one page")
        first = kv.k_caches[0]
        self.device = first.device
        self.cuda = self.device.type == "cuda"
        self.caches = tuple(_raw(t) for pair in zip(kv.k_caches, kv.v_caches, strict=True)
                            for t in pair)                  # K0, V0, K1, V1 ...
        page_shape = tuple(self.caches[0].shape[1:])
        dtype = self.caches[0].dtype
        self.store = torch.empty((num_pages, len(self.caches), *page_shape), dtype=dtype)
        self.stream: torch.cuda.Stream | None = None
        self.staging: torch.Tensor | None = None
        self._unpin: weakref.finalize | None = None
        if self.cuda:
            self.stream = torch.cuda.Stream(self.device)
            self._register()
            self.staging = torch.empty((min(staging_pages, num_pages), len(self.caches),
                                        *page_shape), dtype=dtype, device=self.device)
        self.offloaded_pages = 0
        self.onloaded_pages = 0

    @property
    def num_pages(self) -> int:
        return int(self.store.shape[0])

    @property
    def num_bytes(self) -> int:
        return self.store.numel() * self.store.element_size()

    def _register(self) -> None:
        """Pins the store. The finalizer holds the tensor, so its memory is unregistered before
        it can be freed, whether the store is closed or only collected (an engine dropped
        without closing: every GPU test's): the driver keeps a registered range mapped, and
        freeing it under the driver is undefined behaviour."""
        error = torch.cuda.cudart().cudaHostRegister(self.store.data_ptr(), self.num_bytes, 0)
        if int(error) != 0:
            raise InternalError(f"pinning {self.num_bytes / 2**30:.1f} GiB of host memory for "
                                f"the KV host tier failed (cudaHostRegister error {error}): "
                                "lower --kv-offload-gib")
        self._unpin = weakref.finalize(self, _unregister, self.store, self.stream)
        self._unpin.atexit = False     # the process's exit frees it: no CUDA calls at exit

    @property
    def registered(self) -> bool:
        return self._unpin is not None and self._unpin.alive

    def close(self) -> None:
        """Waits for the copies in flight, then unpins the store; idempotent."""
        if self._unpin is not None:
            self._unpin()

    # -- a step's copies --------------------------------------------------------------------
    def run(self, transfers: KVTransfers, model_stream: torch.cuda.Stream | None = None
            ) -> None:
        """Offloads, then onloads; on CUDA `model_stream` waits for them."""
        if not transfers:
            return
        self.offloaded_pages += len(transfers.offload)
        self.onloaded_pages += len(transfers.onload)
        if not self.cuda:
            self._run_cpu(transfers)
            return
        assert self.stream is not None
        with torch.cuda.stream(self.stream):
            self._offload(sorted(transfers.offload, key=lambda pair: pair[1]))
            self._onload(sorted(transfers.onload))
            done = torch.cuda.Event()
            done.record(self.stream)
        (model_stream or torch.cuda.current_stream(self.device)).wait_event(done)

    def _run_cpu(self, transfers: KVTransfers) -> None:
        if transfers.offload:
            gpu, host = zip(*transfers.offload, strict=True)
            index = torch.tensor(gpu, dtype=torch.long)
            self.store[torch.tensor(host, dtype=torch.long)] = torch.stack(
                [cache.index_select(0, index) for cache in self.caches], dim=1)
        if transfers.onload:
            host, gpu = zip(*transfers.onload, strict=True)
            rows = self.store[torch.tensor(host, dtype=torch.long)]
            index = torch.tensor(gpu, dtype=torch.long)
            for layer, cache in enumerate(self.caches):
                cache.index_copy_(0, index, rows[:, layer])

    def _index(self, ids: list[int]) -> torch.Tensor:
        return torch.tensor(ids, dtype=torch.long).pin_memory().to(self.device,
                                                                    non_blocking=True)

    def _offload(self, pairs: list[tuple[int, int]]) -> None:
        staging = self.staging
        assert staging is not None
        size = int(staging.shape[0])
        for start in range(0, len(pairs), size):
            chunk = pairs[start:start + size]
            index = self._index([gpu for gpu, _ in chunk])
            torch.stack([cache.index_select(0, index) for cache in self.caches], dim=1,
                        out=staging[:len(chunk)])
            for host, first, length in _runs([host for _, host in chunk]):
                self.store[host:host + length].copy_(staging[first:first + length],
                                                     non_blocking=True)

    def _onload(self, pairs: list[tuple[int, int]]) -> None:
        staging = self.staging
        assert staging is not None
        size = int(staging.shape[0])
        for start in range(0, len(pairs), size):
            chunk = pairs[start:start + size]
            for host, first, length in _runs([host for host, _ in chunk]):
                staging[first:first + length].copy_(self.store[host:host + length],
                                                    non_blocking=True)
            index = self._index([gpu for _, gpu in chunk])
            rows = staging[:len(chunk)]
            for layer, cache in enumerate(self.caches):
                cache.index_copy_(0, index, rows[:, layer])
