"""The ingress's body checks (gateway/validation.py) without a server: non-finite numbers are
found wherever a JSON value can be, escaped quotes included (the end-to-end refusals per route
are in test_e2e_robustness.py), and a base64 image whose letters happen to spell NaN, Infinity
or a large exponent is not parsed a second time."""

from __future__ import annotations

import base64
import json

import pytest

from gateway import validation


@pytest.mark.parametrize(("body", "field", "literal"), [
    (b"NaN", "body", "NaN"),
    (b"[1, -Infinity]", "[1]", "-Infinity"),
    (b'{"a":\n\t-Infinity}', "a", "-Infinity"),
    (b'{"a": [0.5,1E+400]}', "a[1]", "1E+400"),
    (b'{"a": {"b": 1.5e999}}', "a.b", "1.5e999"),
    (b'{"a":12e3000}', "a", "12e3000"),
    (b'{"t": "say \\"hi\\"", "a": NaN}', "a", "NaN"),          # escaped quotes
    (b'{"t": "a\\\\", "a": [Infinity]}', "a[0]", "Infinity"),   # an escaped backslash
])
def test_non_finite_numbers_are_found_where_values_start(body, field, literal):
    error = validation.check_body(body)
    assert error is not None and error.param == ("" if field == "body" else field)
    assert error.message.startswith(f"{field}: {literal} is not a finite number")


@pytest.mark.parametrize("body", [
    b'{"a": 1e308, "b": "NaN and Infinity in text", "c": [1.5e-999]}',
    b'{"text": "x: NaN, y: 1e999"}',       # inside a string
    b'{"text": "\\"NaN\\" 1e999"}',          # and with escaped quotes
])
def test_finite_bodies_pass(body):
    assert validation.check_body(body) is None


def test_an_image_data_url_is_not_parsed_twice(monkeypatch):
    """Base64 letters spell NaN, Infinity and 1e234-like runs by chance; none of them is where
    a JSON value starts, so the hooked second parse does not run."""
    letters = "AANaNB1e234CInfinityD9e999+/" * 20000       # the base64 alphabet only
    url = "data:image/png;base64," + letters + base64.b64encode(bytes(range(256))).decode()
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": url}}]}], "temperature": 0.5}).encode()
    assert b"NaN" in body and b"Infinity" in body

    def parsed(*args, **kwargs):
        raise AssertionError("the body was parsed again")

    monkeypatch.setattr(validation.json, "loads", parsed)
    assert validation.check_finite(body) is None


def test_random_bodies_agree_with_a_full_parse():
    """Strings full of quotes, backslashes and number-like text, with a non-finite value
    placed in some bodies: the check refuses exactly those."""
    import random

    rng = random.Random(7)
    alphabet = ['"', "\\", "NaN", "Infinity", "1e999", ":", ",", "[", " ", "a", "\n", "é"]

    def text() -> str:
        return "".join(rng.choice(alphabet) for _ in range(rng.randrange(12)))

    for case in range(400):
        value = {text(): [text(), rng.random(), {text(): text()}] for _ in range(3)}
        body = json.dumps(value, ensure_ascii=case % 2 == 0)
        bad = case % 3 == 0
        if bad:
            body = body[:-1] + ', "x": ' + rng.choice(["NaN", "-Infinity", "2e400"]) + "}"
        error = validation.check_finite(body.encode())
        assert (error is not None) == bad, body
        if bad:
            assert error.param == "x"


def test_an_unterminated_string_is_left_to_the_parser():
    assert validation.check_finite(b'{"a": "no end NaN') is None


def test_a_body_of_many_strings_is_scanned_whole():
    """Past QUOTE_WALK_LIMIT quotes the check scans the whole body once (walking a million
    quotes took ten times longer); a non-finite value is still found, and words inside the
    strings only cost the hooked parse."""
    many = ["x"] * (validation.QUOTE_WALK_LIMIT // 2 + 1)
    assert validation._outside_strings(json.dumps(many).encode()) is None
    assert validation._outside_strings(json.dumps(many[:-2]).encode()) is not None
    assert validation.check_finite(json.dumps({"a": many, "b": 1.5}).encode()) is None
    body = json.dumps({"a": many}).encode()[:-1] + b', "b": NaN}'
    error = validation.check_finite(body)
    assert error is not None and error.param == "b"
    assert validation.check_finite(json.dumps({"a": [*many, "NaN 1e999"]}).encode()) is None
