"""Where records' bytes lie (pure): index entries, and the reads that fetch many records.

A record is a range of its batch's string (`lua.py`); its index entry (`layout.IndexEntry`)
says which string and where. Records wanted together were mostly
stored together (a page of a stream is a run of one batch), so the reads merge the ranges of
one string that lie close into one GETRANGE: a page of 64 records is one or two reads of a few
hundred kB instead of 64 commands.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from mutualrl.see.store.layout import parse_index_entry

MERGE_GAP = 64 * 1024
"""Two wanted ranges of one string less than this apart are read as one (the bytes between
are read and dropped): one command costs Redis about as much as copying a few kB."""


@dataclass
class Read:
    """One GETRANGE: bytes [start, end) of string `string_id`, holding the wanted records
    `parts`: (position in the caller's list, offset, length)."""

    string_id: str
    start: int
    end: int
    parts: list[tuple[int, int, int]] = field(default_factory=list)

    def cut(self, data: bytes) -> list[tuple[int, bytes | None]]:
        """Each part's bytes out of what the GETRANGE returned (None where the string was
        shorter: it went, or was never whole)."""
        out: list[tuple[int, bytes | None]] = []
        for pos, off, length in self.parts:
            chunk = data[off - self.start:off - self.start + length]
            out.append((pos, chunk if len(chunk) == length else None))
        return out


def location(loc: bytes) -> tuple[str, int, int] | None:
    """Where an index entry's record lies: (batch string id, offset, length); None for an entry
    of the layout before batch strings."""
    entry = parse_index_entry(loc)
    if entry.string_id is None:
        return None
    return entry.string_id, entry.offset, entry.length


def plan_reads(locs: Sequence[bytes | None], gap: int = MERGE_GAP
               ) -> tuple[list[Read], list[int]]:
    """The reads for index entries `locs` (None: no entry): the merged GETRANGEs, and the
    positions whose entries are of the layout before batch strings (their payload is a key of
    its own, `rec:<record id>`)."""
    wanted: list[tuple[str, int, int, int]] = []
    old: list[int] = []
    for pos, loc in enumerate(locs):
        if loc is None:
            continue
        where = location(loc)
        if where is None:
            old.append(pos)
        elif where[2] > 0:  # (no record serializes to nothing: it has an id)
            wanted.append((*where, pos))
    wanted.sort()
    reads: list[Read] = []
    for string_id, off, length, pos in wanted:
        last = reads[-1] if reads else None
        if last is not None and last.string_id == string_id and off - last.end <= gap:
            last.end = max(last.end, off + length)
        else:
            last = Read(string_id, off, off + length)
            reads.append(last)
        last.parts.append((pos, off, length))
    return reads, old
