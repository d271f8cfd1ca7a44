"""PrefixHistory keys: chained BLAKE2b-128 blocks, exact partial endpoints, conditioning."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from services.common.errors import ValidationError
from services.engine.prefix.history import BLOCK_TOKENS, KEY_BYTES, ConditioningEvent, PrefixHistory

IDENTITY = hashlib.blake2b(b"model", digest_size=32).digest()
OTHER_IDENTITY = hashlib.blake2b(b"other model", digest_size=32).digest()


def image(position: int, name: bytes) -> ConditioningEvent:
    return ConditioningEvent(position, hashlib.blake2b(name, digest_size=32).digest())


def test_keys_are_16_bytes_and_chain_from_the_identity():
    tokens = list(range(200))
    a, b = PrefixHistory(IDENTITY, tokens), PrefixHistory(OTHER_IDENTITY, tokens)
    assert a.num_blocks == 3 and all(len(a.key(t)) == KEY_BYTES for t in range(201))
    assert a.key(0) == a.root_key != b.root_key
    assert all(a.key(t) != b.key(t) for t in range(201))
    assert a.key(64) == a.block_key(0) and a.key(128) == a.block_key(1)
    assert len({a.key(t) for t in range(201)}) == 201


def test_block_keys_chain_so_a_change_propagates_forward_only():
    base = list(range(300))
    changed = list(base)
    changed[70] = 99999
    a, b = PrefixHistory(IDENTITY, base), PrefixHistory(IDENTITY, changed)
    assert a.block_key(0) == b.block_key(0)
    assert a.block_key(1) != b.block_key(1) and a.block_key(3) != b.block_key(3)
    assert a.key(70) == b.key(70) and a.key(71) != b.key(71)


def test_partial_key_depends_on_aligned_parent_and_remaining_tokens():
    a = PrefixHistory(IDENTITY, list(range(100)))
    b = PrefixHistory(IDENTITY, [*range(64), *range(1000, 1036)])
    assert a.key(64) == b.key(64) and a.key(65) != b.key(65)
    # the same remaining tokens after a different parent give a different key
    c = PrefixHistory(IDENTITY, [7, *range(1, 64), *range(64, 100)])
    assert c.key(100) != a.key(100)
    # complete-block keys do not depend on partial endpoints being asked for
    a.key(99)
    assert a.block_key(0) == PrefixHistory(IDENTITY, list(range(64))).block_key(0)


def test_conditioning_affects_prefixes_that_consume_its_position():
    tokens = list(range(150))
    plain = PrefixHistory(IDENTITY, tokens)
    with_image = PrefixHistory(IDENTITY, tokens, [image(80, b"cat")])
    for t in range(81):
        assert plain.key(t) == with_image.key(t)
    for t in range(81, 151):
        assert plain.key(t) != with_image.key(t)
    other_image = PrefixHistory(IDENTITY, tokens, [image(80, b"dog")])
    assert other_image.key(81) != with_image.key(81)
    moved = PrefixHistory(IDENTITY, tokens, [image(81, b"cat")])
    assert moved.key(81) == plain.key(81) and moved.key(82) != with_image.key(82)


def test_events_at_one_position_keep_their_order():
    tokens = list(range(70))
    ab = PrefixHistory(IDENTITY, tokens, [image(10, b"a"), image(10, b"b")])
    ba = PrefixHistory(IDENTITY, tokens, [image(10, b"b"), image(10, b"a")])
    assert ab.key(10) == ba.key(10)
    assert ab.key(11) != ba.key(11) and ab.block_key(0) != ba.block_key(0)


def test_events_must_come_before_the_tokens_they_condition():
    history = PrefixHistory(IDENTITY, list(range(10)))
    with pytest.raises(ValidationError, match="add events first"):
        history.add_event(image(5, b"late"))
    history.add_event(image(12, b"x"))
    with pytest.raises(ValidationError, match="position order"):
        history.add_event(image(11, b"y"))
    with pytest.raises(ValidationError):
        ConditioningEvent(3, b"short")
    with pytest.raises(ValidationError):
        PrefixHistory(b"short")
    with pytest.raises(ValidationError):
        history.key(11)


@settings(max_examples=60, deadline=None)
@given(prompt=st.lists(st.integers(0, 2**20), min_size=1, max_size=3 * BLOCK_TOKENS),
       suffix=st.lists(st.integers(0, 2**20), max_size=2 * BLOCK_TOKENS),
       image_at=st.one_of(st.none(), st.integers(0, 4 * BLOCK_TOKENS)),
       split=st.integers(0, 400))
def test_keys_stay_stable_when_later_tokens_or_images_are_appended(prompt, suffix, image_at,
                                                                     split):
    """Growing a history (incrementally, in any split) never changes an earlier key."""
    before = PrefixHistory(IDENTITY, prompt)
    keys = [before.key(t) for t in range(len(prompt) + 1)]
    grown = PrefixHistory(IDENTITY)
    full = prompt + suffix
    cut = min(split, len(full))
    grown.extend(full[:cut])
    if image_at is not None and image_at >= max(cut, len(prompt)):
        grown.add_event(image(image_at, b"later"))
    grown.extend(full[cut:])
    assert [grown.key(t) for t in range(len(prompt) + 1)] == keys
    once = PrefixHistory(IDENTITY, full)
    assert [once.key(t) for t in range(len(prompt) + 1)] == keys
