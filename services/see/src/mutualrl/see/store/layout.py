"""SEE's storage format in Redis, each layout once with its build and parse side by side: the
separators, a stream entry's header, a stream id, an id-index entry, a publish batch's record
rows, and the publish script's ARGV (the script's own prologue is generated from the same list,
`ARGV_LUA`, so Python and Lua cannot disagree on a position).

The publish script (`lua.py`) writes index entries itself, inside Redis; `index_entry` builds the
same string (tests hold the two to each other), and every reader, the inspection API included,
parses entries through `parse_index_entry`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from mutualrl.v1 import experience_pb2 as pb

HEADER_SEP = "\x1f"
"""Joins a stream entry's header fields, and a REWARD_STATS / VERIFIED_SUCCESS row's aux fields
(ids never contain control characters: `mutualrl.common.ids.RECORD_KEY`)."""
FIELD_SEP = "\x1d"
"""Joins the fields of one record's row in the publish script's batch argument."""
RECORD_SEP = "\x1e"
"""Joins the records' rows in the publish script's batch argument."""
HEADER_FIELD = b"h"
"""The one field of a stream entry: its header."""


def as_str(value: bytes | str) -> str:
    """A Redis reply (bytes: SEE's client does not decode) as text."""
    return value.decode() if isinstance(value, bytes) else value


# ---- stream ids ------------------------------------------------------------------------------

def stream_id_key(sid: str) -> tuple[int, int]:
    """A stream id `<ms>-<seq>` as a sortable pair (a missing seq reads 0)."""
    a, _, b = sid.partition("-")
    return int(a), int(b or 0)


def stream_id(ms: int, seq: int) -> str:
    """The stream id of (ms, seq)."""
    return f"{ms}-{seq}"


# ---- a stream entry's header -------------------------------------------------------------------

@dataclass
class Header:
    """The plain fields of a stream entry (filters read these without parsing the record)."""

    record_id: str
    policy_id: str
    prompt_id: str
    round: int
    verified: bool
    policy_version: int

    def build(self) -> str:
        """The header as stored: its fields joined by HEADER_SEP, the record id first (the
        script's trim reads it as the text before the first separator)."""
        return HEADER_SEP.join((self.record_id, self.policy_id, self.prompt_id, str(self.round),
                                "1" if self.verified else "0", str(self.policy_version)))

    @classmethod
    def parse(cls, text: str) -> Header:
        rid, pol, prompt, rnd, ver, pv = text.split(HEADER_SEP)
        return cls(rid, pol, prompt, int(rnd), ver == "1", int(pv))

    @classmethod
    def of(cls, fields: dict[bytes, bytes]) -> Header:
        """The header of a stream entry's fields."""
        return cls.parse(fields[HEADER_FIELD].decode())


# ---- id-index entries --------------------------------------------------------------------------

@dataclass(frozen=True)
class IndexEntry:
    """Where a record lies: `<kind>:<stream id>:<string id>:<offset>:<length>`, the record's
    bytes being `GETRANGE <run>b:<string id> <offset> <offset + length - 1>`. An entry written
    before batch strings reads `<kind>:<stream id>` (`string_id` None), its payload under
    `<run>rec:<record id>`."""

    kind: int
    stream_id: str
    string_id: str | None = None
    offset: int = 0
    length: int = 0

    def build(self) -> str:
        head = f"{self.kind}:{self.stream_id}"
        if self.string_id is None:
            return head
        return f"{head}:{self.string_id}:{self.offset}:{self.length}"


def index_entry(kind: int, sid: str, string_id: str, offset: int, length: int) -> str:
    """The index entry of a record stored at [offset, offset + length) of string `string_id`
    (what the publish script writes)."""
    return IndexEntry(kind, sid, string_id, offset, length).build()


def parse_index_entry(raw: bytes | str) -> IndexEntry:
    """An index entry of either layout; ValueError naming the entry for anything else."""
    text = as_str(raw)
    fields = text.split(":")
    try:
        if len(fields) == 2:
            return IndexEntry(int(fields[0]), fields[1])
        if len(fields) == 5:
            return IndexEntry(int(fields[0]), fields[1], fields[2], int(fields[3]),
                              int(fields[4]))
    except ValueError:
        pass
    raise ValueError(f"malformed index entry {text[:100]!r}")


def batch_string_id(nonce: str, kind: int) -> str:
    """The id of a publish batch's string of the records of `kind` (the key is
    `<run>b:<id>`)."""
    return f"{nonce}{kind}"


# ---- a publish batch's record rows -----------------------------------------------------------

def record_row(record_id: str, kind: int, size: int, header: Header, aux: str = "") -> str:
    """One record's row of the batch argument: id, kind, payload size, policy, header, aux
    (`stats_aux` / `success_aux`; empty for a ROLLOUT)."""
    return FIELD_SEP.join((record_id, str(kind), str(size), header.policy_id, header.build(),
                           aux))


def stats_aux(key_index: int, prompt: str, policy: str, stats: pb.RewardStats,
              round_k: int) -> str:
    """A REWARD_STATS row's aux: the round-stats hash (KEYS index), its field and value
    ("count,sum,sum_sq,max" and ",success_max" when the stats carry one), the round."""
    value = f"{stats.count},{stats.sum!r},{stats.sum_sq!r},{stats.max!r}"
    if stats.HasField("success_max"):
        value += f",{stats.success_max!r}"
    return HEADER_SEP.join((str(key_index), f"{prompt}|{policy}", value, str(round_k)))


def success_aux(key_index: int, policy: str, text_digest: str) -> str:
    """A VERIFIED_SUCCESS row's aux: the prompt's success hash (KEYS index) and its field."""
    return HEADER_SEP.join((str(key_index), f"{policy}|{text_digest}"))


SUCCESS_ROUNDS_PER_TEXT = 16
"""Rounds a prompt's success index remembers per distinct text (the latest): a peer reading
from round q needs the text's earliest record from q on, not its latest, which the deterministic
mode's bounded reads (`max_round`) would drop when the policy has given the text again since."""


def success_record_ids(value: bytes | str) -> list[str]:
    """The record ids a success index value holds, oldest round first: "|<round>:<id>"
    entries the publish script appends, or one bare id (the layout before, never starting with
    '|': ids hold no '|')."""
    text = as_str(value)
    if not text.startswith("|"):
        return [text]
    return [entry.partition(":")[2] for entry in text[1:].split("|")]


def batch_rows(rows: Sequence[str]) -> str:
    """The batch argument: every record's row."""
    return RECORD_SEP.join(rows)


# ---- the publish script's KEYS and ARGV --------------------------------------------------------

KEYS = ("lastid", "idx", "counts", "trimmed", "config", "rounds", "stream_rollout",
        "stream_reward_stats", "stream_verified_success", "blobs")
"""The script's fixed KEYS, in order (KEYS[1]..KEYS[10]); the auxiliary keys (round-stats and
success hashes) follow, and a row's aux names them by position."""
ARGV = ("maxlen", "ttl", "max_rounds", "max_succ", "n", "rs_prefix", "blob_prefix", "slack",
        "rows", "nonce", "old_prefix", "present")
"""The script's ARGV, in order: stream cap, TTL, round cap, successes per prompt, records in
the batch, round-stats key prefix, batch string key prefix (`<run>b:`), trim slack, the rows
(`batch_rows`), the batch's nonce, the old layout's record key prefix (`<run>rec:`), the kinds
in the batch as digits ("13")."""
_NUMERIC = frozenset({"maxlen", "ttl", "max_rounds", "max_succ", "n", "slack"})
ARGV_LUA = "\n".join(
    f"local {name} = {'tonumber(' if name in _NUMERIC else ''}ARGV[{i}]"
    f"{')' if name in _NUMERIC else ''}" for i, name in enumerate(ARGV, 1))
"""The script's prologue: each ARGV slot as a named Lua local."""


@dataclass(frozen=True)
class PublishArgs:
    """The values of the script's ARGV (`ARGV` names them, in order)."""

    maxlen: int
    ttl: int
    max_rounds: int
    max_succ: int
    n: int
    rs_prefix: str
    blob_prefix: str
    slack: int
    rows: str
    nonce: str
    old_prefix: str
    present: str

    def argv(self) -> list[str | int]:
        return [getattr(self, name) for name in ARGV]

    @classmethod
    def parse(cls, argv: Sequence[bytes | str | int]) -> PublishArgs:
        """The arguments back from an ARGV list (what the script reads; tests use it)."""
        if len(argv) != len(ARGV):
            raise ValueError(f"the publish script takes {len(ARGV)} arguments, got {len(argv)}")
        values: dict[str, Any] = {
            name: int(v) if name in _NUMERIC else (as_str(v) if isinstance(v, bytes) else str(v))
            for name, v in zip(ARGV, argv, strict=True)}
        return cls(**values)
