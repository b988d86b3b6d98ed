"""The PublishResponse written straight as bytes (pure: no grpc, no redis).

A batch of 4,096 records would otherwise build 4,096 PublishResult messages one by one; the
bytes are protobuf's own encoding (tests/unit/test_see_wire.py compares them byte for byte).
"""

from __future__ import annotations


def encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def publish_response(record_ids: list[bytes], flags: str) -> bytes:
    """Serialized PublishResponse: one PublishResult per record, then stored/duplicates."""
    parts: list[bytes] = []
    stored = 0
    for rid, flag in zip(record_ids, flags, strict=True):
        ok = flag == "1"
        stored += ok
        n = len(rid)
        if n < 124:  # both lengths fit one byte: the common case, without varint calls
            parts.append(b"\x0a%c\x0a%c%s\x10%c" % (n + 4, n, rid, 1 if ok else 2))
            continue
        inner = b"\x0a" + encode_varint(n) + rid + (b"\x10\x01" if ok else b"\x10\x02")
        parts.append(b"\x0a" + encode_varint(len(inner)) + inner)
    dups = len(record_ids) - stored
    if stored:
        parts.append(b"\x10" + encode_varint(stored))
    if dups:
        parts.append(b"\x18" + encode_varint(dups))
    return b"".join(parts)
