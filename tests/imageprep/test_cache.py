"""Retention tiers: memory budget and LRU eviction, disk reuse across restarts, Redis, records."""

from __future__ import annotations

import numpy as np
import pytest
import redis

from services.common.errors import UnavailableError
from services.imageprep.cache.disk import DiskTier
from services.imageprep.cache.memory import MemoryTier
from services.imageprep.cache.redis_tier import PREFIX, RedisTier
from services.imageprep.cache.retention import RetentionCache
from services.imageprep.config import ImagePrepConfig
from services.imageprep.prepared import CorruptRecord, decode_record, encode_record
from services.imageprep.server import build_cache
from tests.imageprep.images import prepared_image
from tests.support.processes import free_port

KEY = b"k" * 32


def same(a, b) -> bool:
    return (a.identity == b.identity and a.geometry == b.geometry and a.profile == b.profile
            and [n for n, _ in a.named_tensors()] == [n for n, _ in b.named_tensors()]
            and all(np.array_equal(x, y) and x.dtype == y.dtype
                    for (_, x), (_, y) in zip(a.named_tensors(), b.named_tensors(), strict=True)))


@pytest.fixture(scope="module")
def images():
    return [prepared_image(seed=i) for i in range(4)]   # 256x256 each (qwen3 minimum)


# -- records ---------------------------------------------------------------------------------


def test_record_round_trip_is_exact(images):
    for profile in ("qwen3_vl", "qwen2_5_vl"):
        image = prepared_image(seed=9, profile=profile)
        assert same(decode_record(encode_record(image)), image)


def test_images_hold_and_records_carry_uint8_pixels(images):
    """pixel_values is computed from the retained uint8 pixels: an image holds about an
    eighth of its float32 bytes (retention counts that), its record carries the pixels, and
    a record of the float32 format before (HELIOSIMG1) is refused (prepared again)."""
    image = images[0]
    pixel_values = image.tensors["pixel_values"]
    assert image.pixel_bytes == pixel_values.nbytes
    assert image.pixels.pixels.dtype == np.uint8
    assert image.nbytes < pixel_values.nbytes / 4
    blob = encode_record(image)
    assert len(blob) < pixel_values.nbytes / 4
    assert np.array_equal(decode_record(blob).tensors["pixel_values"], pixel_values)
    with pytest.raises(CorruptRecord, match="not a prepared-image record"):
        decode_record(b"HELIOSIMG1\n" + blob[len(b"HELIOSIMG2\n"):])


def test_corrupt_records_are_refused(images):
    blob = bytearray(encode_record(images[0]))
    blob[-1] ^= 0xFF
    with pytest.raises(CorruptRecord, match="checksum"):
        decode_record(bytes(blob))
    with pytest.raises(CorruptRecord, match="payload is"):
        decode_record(encode_record(images[0])[:-10])
    with pytest.raises(CorruptRecord, match="not a prepared-image record"):
        decode_record(b"garbage")


# -- memory ----------------------------------------------------------------------------------


def test_memory_budget_evicts_least_recently_used(images):
    size = images[0].nbytes
    memory = MemoryTier(budget_bytes=2 * size + size // 2)
    assert memory.put(images[0]) and memory.put(images[1])
    assert memory.get(images[0].identity) is images[0]        # 0 is now the most recent
    assert memory.put(images[2])                               # evicts 1, not 0
    assert memory.get(images[1].identity) is None
    assert memory.get(images[0].identity) is images[0]
    assert memory.get(images[2].identity) is images[2]
    stats = memory.stats()
    assert stats.num_images == 2 and stats.num_bytes == 2 * size and stats.evictions == 1


def test_memory_refuses_an_image_larger_than_its_budget(images):
    memory = MemoryTier(budget_bytes=images[0].nbytes - 1)
    assert not memory.put(images[0])
    assert memory.get(images[0].identity) is None and memory.stats().num_bytes == 0


def test_memory_source_bindings_are_bounded():
    memory = MemoryTier(budget_bytes=0, max_sources=2)
    for i in range(3):
        memory.bind_source(bytes([i]) * 32, b"i" * 32)
    assert memory.lookup_source(b"\x00" * 32) is None
    assert memory.lookup_source(b"\x02" * 32) == b"i" * 32


# -- disk ------------------------------------------------------------------------------------


def test_disk_tier_survives_a_restart(tmp_path, images):
    disk = DiskTier(tmp_path, budget_bytes=1 << 30)
    assert disk.put(images[0])
    disk.bind_source(KEY, images[0].identity)
    reopened = DiskTier(tmp_path, budget_bytes=1 << 30)
    assert reopened.num_bytes == disk.num_bytes > images[0].nbytes
    assert same(reopened.get(images[0].identity), images[0])
    assert reopened.lookup_source(KEY) == images[0].identity
    assert reopened.get(images[1].identity) is None


def test_disk_budget_evicts_least_recently_used(tmp_path, images):
    record = len(encode_record(images[0]))
    disk = DiskTier(tmp_path, budget_bytes=2 * record + record // 2)
    disk.put(images[0])
    disk.put(images[1])
    assert disk.get(images[0].identity) is not None            # refreshes 0
    disk.put(images[2])
    assert disk.get(images[1].identity) is None
    assert disk.get(images[0].identity) is not None and disk.get(images[2].identity) is not None
    assert disk.num_bytes <= disk.budget_bytes
    # A restart with a smaller budget trims what it finds.
    assert DiskTier(tmp_path, budget_bytes=record).num_bytes <= record


def test_disk_drops_a_corrupt_record(tmp_path, images):
    disk = DiskTier(tmp_path, budget_bytes=1 << 30)
    disk.put(images[0])
    path = next(tmp_path.glob("images/*/*.rec"))
    blob = bytearray(path.read_bytes())
    blob[-1] ^= 0xFF
    path.write_bytes(bytes(blob))
    assert disk.get(images[0].identity) is None
    assert not path.exists() and disk.num_bytes == 0


# -- redis -----------------------------------------------------------------------------------


def test_redis_tier_shares_records_with_a_ttl(redis_url, images):
    tier = RedisTier(redis_url, ttl_s=120)
    tier.check()
    assert tier.put(images[0])
    tier.bind_source(KEY, images[0].identity)
    other = RedisTier(redis_url, ttl_s=120)                     # another replica
    assert same(other.get(images[0].identity), images[0])
    assert other.lookup_source(KEY) == images[0].identity
    assert other.get(images[1].identity) is None
    client = redis.Redis.from_url(redis_url)
    assert 0 < client.ttl(f"{PREFIX}image:{images[0].identity.hex()}") <= 120
    client.set(f"{PREFIX}image:{images[1].identity.hex()}", b"corrupt")
    assert other.get(images[1].identity) is None
    assert not client.exists(f"{PREFIX}image:{images[1].identity.hex()}")


def test_unreachable_redis_fails_startup(tmp_path):
    config = ImagePrepConfig(redis_url=f"redis://127.0.0.1:{free_port()}/0",
                             disk_cache_dir=str(tmp_path))
    with pytest.raises(UnavailableError, match="cannot reach its Redis tier"):
        build_cache(config)


def test_unreachable_redis_fails_the_check_and_degrades_to_misses(images):
    tier = RedisTier(f"redis://127.0.0.1:{free_port()}/0", ttl_s=60)
    with pytest.raises(UnavailableError, match="cannot reach its Redis tier"):
        tier.check()
    assert tier.get(images[0].identity) is None
    assert not tier.put(images[0])
    assert tier.lookup_source(KEY) is None


# -- the facade ------------------------------------------------------------------------------


def test_retention_promotes_lower_tier_hits(tmp_path, redis_url, images):
    disk = DiskTier(tmp_path, budget_bytes=1 << 30)
    tier = RedisTier(redis_url, ttl_s=60)
    cache = RetentionCache(MemoryTier(1 << 30), [disk, tier])
    cache.put(KEY, images[0])
    assert cache.flush(timeout=30)
    assert disk.get(images[0].identity) is not None and tier.get(images[0].identity) is not None
    # A fresh replica with an empty memory tier and an empty disk finds it through Redis ...
    fresh_disk = DiskTier(tmp_path / "other", budget_bytes=1 << 30)
    fresh = RetentionCache(MemoryTier(1 << 30), [fresh_disk, RedisTier(redis_url, ttl_s=60)])
    assert fresh.lookup_source(KEY) == images[0].identity
    assert same(fresh.get(images[0].identity), images[0])
    # ... and promotes it into its memory and disk tiers.
    assert fresh.get_from_memory(images[0].identity) is not None
    assert fresh_disk.get(images[0].identity) is not None
    assert fresh_disk.lookup_source(KEY) == images[0].identity
    cache.close()
    fresh.close()
