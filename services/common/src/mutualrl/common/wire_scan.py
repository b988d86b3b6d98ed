"""Reading a serialized protobuf message from its tags and lengths alone, without parsing it
(pure: no grpc).

What a service must know of a request before it may parse it (which policies it acts as, how
many entries a repeated field holds, where each item lies) is read here: a scan walks the
message's tags, skips what it does not need by its length, and allocates nothing per field it
passes, so a 60 MiB body costs a scan, not its parsed objects. Every scan is bounded by a count
of tags (`Fields.left`): a body of millions of tiny fields is refused after that many, not
walked to its end by a Python loop.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

MAX_GROUP_DEPTH = 100  # as protobuf's own parser
LENGTH_DELIMITED = 2


class Fields:
    """A message's bytes read tag by tag, at most `limit` tags in all (nested ones
    included)."""

    def __init__(self, data: bytes | memoryview, limit: int) -> None:
        self.data = data
        self.left = limit

    def varint(self, at: int) -> tuple[int, int]:
        """The varint at `at` and where it ends."""
        data, value = self.data, 0
        for shift in range(0, 70, 7):
            if at >= len(data):
                break
            byte = data[at]
            at += 1
            value |= (byte & 0x7F) << shift
            if byte < 0x80:
                return value, at
        raise DecodeError("truncated or overlong varint")

    def tag(self, at: int) -> tuple[int, int]:
        """The tag at `at` and where it ends."""
        self.left -= 1
        if self.left < 0:
            raise DecodeError("too many fields")
        return self.varint(at)

    def skip(self, at: int, tag: int, depth: int = 0) -> int:
        """Where the field whose `tag` was read just before `at` ends (a group: after its end
        tag; unknown fields may be groups)."""
        kind = tag & 7
        if kind == 0:
            return self.varint(at)[1]
        if kind in (1, 5):
            return at + (8 if kind == 1 else 4)
        if kind == LENGTH_DELIMITED:
            size, at = self.varint(at)
            return at + size
        if kind == 3:
            if depth >= MAX_GROUP_DEPTH:
                raise DecodeError(f"groups nested over {MAX_GROUP_DEPTH} deep")
            while True:
                inner, at = self.tag(at)
                if inner & 7 == 4:
                    if inner >> 3 != tag >> 3:
                        raise DecodeError(f"group {tag >> 3} ended by {inner >> 3}")
                    return at
                at = self.skip(at, inner, depth + 1)
                if at > len(self.data):
                    raise DecodeError("group runs past the end")
        raise DecodeError(f"wire type {kind}")

    def fields(self, start: int = 0, end: int | None = None
               ) -> Iterator[tuple[int, int, int, int]]:
        """(tag, field start, value start, field end) of each field in data[start:end]; a
        length-delimited value starts after its length."""
        end = len(self.data) if end is None else end
        at = start
        while at < end:
            first = at
            tag, at = self.tag(at)
            body = at
            at = self.skip(at, tag)
            if at > end:
                raise DecodeError(f"field at byte {first} runs past the end")
            if tag & 7 == LENGTH_DELIMITED:
                body = self.varint(body)[1]
            yield tag, first, body, at


def field_path(message: Descriptor, path: Sequence[str]) -> tuple[int, ...]:
    """The field numbers of a dotted path of names (`("rows", "policy_id")`) in `message`:
    every step but the last a message field, the last a string field."""
    numbers: list[int] = []
    descriptor: Descriptor | None = message
    for name in path:
        if descriptor is None:
            raise ValueError(f"{'.'.join(path)}: {name} is inside a field that is not a message")
        field: FieldDescriptor = descriptor.fields_by_name[name]
        numbers.append(field.number)
        descriptor = field.message_type
    return tuple(numbers)


class TooMany(ValueError):
    """More strings at a path than the caller allows (`strings_at`'s `most`)."""


def strings_at(data: bytes | memoryview, path: Sequence[int], limit: int,
               most: int | None = None) -> list[str]:
    """Every string at `path` (field numbers, `field_path`) in the serialized message `data`,
    in wire order, read from tags and lengths within `limit` tags (DecodeError when the bytes
    do not scan, a string is not UTF-8, or the limit is reached); TooMany as soon as more than
    `most` are found. Proto3 semantics: a field set twice in one message counts as the last
    value, an absent string as ""."""
    found: list[str] = []
    left = _collect(bytes(data), 0, len(data), path, found, limit,
                    len(data) if most is None else most)
    if left < 0:
        raise DecodeError("too many fields")
    return found


def _collect(data: bytes, at: int, end: int, path: Sequence[int], found: list[str],
             left: int, most: int) -> int:
    """`strings_at` over data[at:end]; returns the tags left. One loop with the common
    one-byte tags and lengths read inline: a maximal request holds half a million fields."""
    wanted, rest = path[0] << 3 | LENGTH_DELIMITED, path[1:]
    scan = Fields(data, 0)
    last: str | None = None
    while at < end:
        left -= 1
        if left < 0:
            return left
        tag = data[at]
        if tag < 0x80:
            at += 1
        else:
            tag, at = scan.varint(at)
        if tag & 7 == LENGTH_DELIMITED:
            size = data[at] if at < end else 0x80
            if size < 0x80:
                at += 1
            else:
                size, at = scan.varint(at)
            body, at = at, at + size
        else:
            scan.left = left
            body, at = at, scan.skip(at, tag)
            left = scan.left
        if at > end:
            raise DecodeError(f"field {tag >> 3} runs past the end")
        if tag != wanted:
            continue
        if rest:
            left = _collect(data, body, at, rest, found, left, most)
            if left < 0:
                return left
            if len(found) > most:
                raise TooMany(f"more than {most}")
        else:
            try:
                last = data[body:at].decode("utf-8")
            except UnicodeDecodeError as err:
                raise DecodeError(f"field {tag >> 3} is not valid UTF-8: {err}") from None
    if not rest:
        found.append(last or "")
    return left


def count_fields(data: bytes | memoryview, number: int, most: int, limit: int) -> int:
    """How many top-level fields numbered `number` `data` holds, counting stops past `most`
    (a request refused for them is not scanned to its end)."""
    fields = Fields(data, limit)
    count = 0
    for tag, _, _, _ in fields.fields():
        if tag >> 3 == number:
            count += 1
            if count > most:
                break
    return count
