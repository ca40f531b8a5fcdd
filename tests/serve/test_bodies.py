"""Request bodies: zstd and gzip accepted, size limits 413 (wire and decompressed), bad
encodings and bad JSON are 4xx with the documented shapes."""

from __future__ import annotations

import gzip
import json

import zstandard

from tests.serve.conftest import AUTH, make_client

BODY = {
    "model": "fake",
    "state": "x" * 2000,
    "questions": {"q": {"type": "noul", "instructions": "Is it long?"}},
}


def _post(client, raw: bytes, encoding: str | None = None):
    headers = {**AUTH, "Content-Type": "application/json"}
    if encoding:
        headers["Content-Encoding"] = encoding
    return client.post("/v1/systemone", content=raw, headers=headers)


def test_zstd_and_gzip_bodies_answer_like_plain_ones(client):
    raw = json.dumps(BODY).encode()
    plain = _post(client, raw)
    assert plain.status_code == 200, plain.text
    for enc, data in (
        ("zstd", zstandard.ZstdCompressor().compress(raw)),
        ("gzip", gzip.compress(raw)),
    ):
        r = _post(client, data, enc)
        assert r.status_code == 200, (enc, r.text)
        assert r.json()["answers"] == plain.json()["answers"]


def test_unknown_or_corrupt_encoding_is_a_4xx(client):
    raw = json.dumps(BODY).encode()
    r = _post(client, raw, "br")
    assert r.status_code == 415 and "zstd, gzip" in r.json()["detail"]["message"]
    r = _post(client, b"not zstd at all", "zstd")
    assert r.status_code == 400 and r.json()["detail"]["error_type"] == "invalid_request_error"
    r = _post(client, b"\x1f\x8b garbage", "gzip")
    assert r.status_code == 400


def test_size_limit_on_the_wire_and_after_decompression(fake_engine):
    with make_client(fake_engine, max_body_bytes=4096) as client:
        big = json.dumps({**BODY, "state": "y" * 8000}).encode()
        r = _post(client, big)
        assert r.status_code == 413
        assert "4096 bytes" in r.json()["detail"]["message"]
        bomb = zstandard.ZstdCompressor().compress(big)  # small on the wire, 8 KB inside
        assert len(bomb) < 4096
        r = _post(client, bomb, "zstd")
        assert r.status_code == 413 and "decompressed" in r.json()["detail"]["message"]
        r = _post(client, gzip.compress(big), "gzip")
        assert r.status_code == 413


def test_malformed_json_is_422_with_fastapi_shape(client):
    for raw in (b'{"model": "fake", "state": "x", "questions": {', b"\xff\xfe", b"1" * 5000):
        r = _post(client, raw)
        assert r.status_code == 422, raw[:20]
        item = r.json()["detail"][0]
        assert item["loc"][0] == "body" and item["type"] == "json_invalid"


def test_lone_surrogate_escapes_are_422_not_a_tokenizer_crash(client):
    for raw in (
        b'{"model": "fake", "state": "\\ud800", "questions": {"q": {"type": "noul"}}}',
        b'{"model": "fake", "state": "s", "questions": {"\\udfff": {"type": "noul"}}}',
    ):
        r = _post(client, raw)
        assert r.status_code == 422 and r.json()["detail"][0]["type"] == "string_unicode"
