"""Disk tier: prepared-image records and source bindings as files, surviving restarts.

Layout under the configured directory:

    images/<2 hex>/<identity hex>.rec     one encode_record() blob per image
    sources/<2 hex>/<source key hex>      the 32-byte identity an encoded source prepared to
    tmp/                                  writes in progress (renamed into place atomically)

Files are written to tmp/ and renamed, so a crash never leaves a partial record under its final
name; a record that fails its checksum is deleted and reported as a miss. The byte budget is
enforced by evicting the least recently used records (reads refresh a file's mtime); the index of
sizes is rebuilt from the directory at start, so a restarted service reuses what is there.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from pathlib import Path

from services.imageprep.prepared import CorruptRecord, PreparedImage, decode_record, encode_record

log = logging.getLogger(__name__)

IDENTITY_BYTES = 32


class DiskTier:
    def __init__(self, root: Path | str, budget_bytes: int) -> None:
        self.root = Path(root)
        self.budget_bytes = budget_bytes
        self._images = self.root / "images"
        self._sources = self.root / "sources"
        self._tmp = self.root / "tmp"
        for path in (self._images, self._sources, self._tmp):
            path.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._sizes: dict[str, tuple[float, int]] = {}   # identity hex -> (mtime, size)
        self._bytes = 0
        self._scan()

    def _scan(self) -> None:
        for leftover in self._tmp.iterdir():
            with contextlib.suppress(OSError):
                leftover.unlink()
        for path in self._images.glob("*/*.rec"):
            with contextlib.suppress(OSError):
                stat = path.stat()
                self._sizes[path.stem] = (stat.st_mtime, stat.st_size)
                self._bytes += stat.st_size
        self._evict()

    @staticmethod
    def _shard(base: Path, name: str, suffix: str = "") -> Path:
        return base / name[:2] / (name + suffix)

    def _write(self, target: Path, data: bytes) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._tmp / f"{uuid.uuid4().hex}.part"
        with open(tmp, "wb") as handle:
            handle.write(data)
        os.replace(tmp, target)

    @property
    def num_bytes(self) -> int:
        return self._bytes

    def get(self, identity: bytes) -> PreparedImage | None:
        name = identity.hex()
        path = self._shard(self._images, name, ".rec")
        try:
            blob = path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            image = decode_record(blob)
            if image.identity != identity:
                raise CorruptRecord("record holds another identity")
        except CorruptRecord as exc:
            log.warning("dropping corrupt disk record %s: %s", path, exc)
            self._remove(name)
            return None
        now = time.time()
        with contextlib.suppress(OSError):
            os.utime(path, (now, now))
        with self._lock:
            if name in self._sizes:
                self._sizes[name] = (now, self._sizes[name][1])
        return image

    def put(self, image: PreparedImage) -> bool:
        blob = encode_record(image)
        if len(blob) > self.budget_bytes:
            return False
        name = image.identity.hex()
        self._write(self._shard(self._images, name, ".rec"), blob)
        with self._lock:
            previous = self._sizes.get(name)
            if previous:
                self._bytes -= previous[1]
            self._sizes[name] = (time.time(), len(blob))
            self._bytes += len(blob)
        self._evict()
        return True

    def lookup_source(self, key: bytes) -> bytes | None:
        try:
            identity = self._shard(self._sources, key.hex()).read_bytes()
        except FileNotFoundError:
            return None
        return identity if len(identity) == IDENTITY_BYTES else None

    def bind_source(self, key: bytes, identity: bytes) -> None:
        self._write(self._shard(self._sources, key.hex()), identity)

    def _remove(self, name: str) -> None:
        with contextlib.suppress(OSError):
            self._shard(self._images, name, ".rec").unlink()
        with self._lock:
            entry = self._sizes.pop(name, None)
            if entry:
                self._bytes -= entry[1]

    def _evict(self) -> None:
        """Drop least recently used records until the tier fits its budget."""
        while True:
            with self._lock:
                if self._bytes <= self.budget_bytes or not self._sizes:
                    return
                name = min(self._sizes, key=lambda n: self._sizes[n][0])
            self._remove(name)
