"""Protobuf wire-format helpers for the Publish path (pure: no grpc, no redis).

SEE stores each record as the exact bytes the client serialized plus two appended fields: in
protobuf the last occurrence of a singular field wins, so appending `run_id` and
`created_unix_ms` sets them without re-serializing ~5 KB per record. The response is written
straight as bytes for the same reason.
"""

from __future__ import annotations

F_RUN_ID = 2  # ExperienceRecord.run_id
_F_CREATED_TAG = b"\x98\x01"  # ExperienceRecord.created_unix_ms (field 19, varint)


def encode_varint(value: int) -> bytes:
    if value < 0:
        value += 1 << 64
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def stamp_suffix(run_id_field: bytes, created_ms: int) -> bytes:
    """Appended to a serialized record, sets its run_id and created_unix_ms (appended fields
    win on parse); the same for every record of a batch."""
    return run_id_field + _F_CREATED_TAG + encode_varint(created_ms)


def string_field(field: int, value: str) -> bytes:
    data = value.encode()
    return encode_varint((field << 3) | 2) + encode_varint(len(data)) + data


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
