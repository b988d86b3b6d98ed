"""`ranges.plan_reads`: the merged GETRANGEs give every wanted record exactly its bytes."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from mutualrl.see.store.ranges import Read, plan_reads


@st.composite
def stored(draw: st.DrawFn) -> tuple[dict[str, bytes], list[bytes | None], list[bytes | None]]:
    """Batch strings cut into records, and a request: (strings, index entries asked for, the
    bytes each should get back; None where there is no entry or an old-layout one)."""
    strings: dict[str, bytes] = {}
    records: list[tuple[bytes, bytes]] = []  # (index entry, bytes)
    for s in range(draw(st.integers(1, 4))):
        sizes = draw(st.lists(st.integers(1, 50), min_size=1, max_size=12))
        data = draw(st.binary(min_size=sum(sizes), max_size=sum(sizes)))
        sid = f"{s:032x}{draw(st.integers(1, 3))}"
        strings[sid] = data
        off = 0
        for n in sizes:
            records.append((f"1:5-{len(records)}:{sid}:{off}:{n}".encode(), data[off:off + n]))
            off += n
    picks = draw(st.lists(st.one_of(st.none(), st.just(-1),
                                    st.integers(0, len(records) - 1)), max_size=30))
    locs: list[bytes | None] = []
    want: list[bytes | None] = []
    for p in picks:
        if p is None:
            locs.append(None)
            want.append(None)
        elif p == -1:
            locs.append(b"1:5-0")  # the layout before batch strings
            want.append(None)
        else:
            locs.append(records[p][0])
            want.append(records[p][1])
    return strings, locs, want


@given(stored(), st.integers(0, 200))
def test_every_record_gets_exactly_its_bytes(case: tuple[dict[str, bytes], list[bytes | None],
                                                         list[bytes | None]], gap: int) -> None:
    strings, locs, want = case
    reads, old = plan_reads(locs, gap)
    got: list[bytes | None] = [None] * len(locs)
    for rd in reads:
        for pos, payload in rd.cut(strings[rd.string_id][rd.start:rd.end]):
            assert got[pos] is None
            got[pos] = payload
    assert got == want
    assert old == [i for i, loc in enumerate(locs) if loc == b"1:5-0"]
    # Ranges of one string further apart than the gap are separate reads; nothing is read twice
    # within one read's span.
    spans: dict[str, list[Read]] = {}
    for rd in reads:
        spans.setdefault(rd.string_id, []).append(rd)
    for rds in spans.values():
        for a, b in itertools.pairwise(rds):
            assert b.start - a.end > gap


def test_a_page_of_one_batch_is_one_read_and_a_gone_string_gives_none() -> None:
    locs = [f"1:7-{i}:abc1:{100 * i}:100".encode() for i in range(64)]
    reads, old = plan_reads(locs)
    assert old == [] and len(reads) == 1
    assert (reads[0].start, reads[0].end) == (0, 6400)
    assert all(p is None for _, p in reads[0].cut(b""))  # the string went meanwhile
    far = plan_reads([b"1:7-0:abc1:0:10", b"1:7-1:abc1:200000:10"])[0]
    assert [(r.start, r.end) for r in far] == [(0, 10), (200000, 200010)]
