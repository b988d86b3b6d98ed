"""Redis key layout of SEE (pure), in the common scheme (`mutualrl.common.keys`).

Every key of a run carries the run id as a hash tag (`<prefix>:see:{<run_id>}:...`) so a run
lives in one Redis Cluster slot and one Lua script may touch all of its keys. Only the registry
of run ids (`<prefix>:see:runs`) spans runs.

| key | type | holds |
|---|---|---|
| `config` | string | serialized `Run` (config + creation time) |
| `s:<KIND>` | stream | one entry per record of that kind; field h = "rid, policy, prompt, round,
  verified, version" joined by \x1f (filters read it without touching the payload) |
| `b:<nonce><kind>` | string | one Publish batch's serialized ExperienceRecords of one kind
  (each exactly as the client sent it, plus run_id and created_unix_ms), one after another |
| `blobs` | hash | "<nonce><kind>" -> how many records of that string are still stored |
| `idx` | hash | record_id -> "<kind number>:<stream id>:<nonce><kind>:<offset>:<length>" (the
  idempotency index; the record's bytes are that range of `b:<nonce><kind>`) |
| `rec:<record_id>` | string | a record's payload in the layout before batch strings (read and
  trimmed still; no longer written) |
| `lastid` | string | last stream id issued; ids are unique across the run's three streams |
| `counts` | hash | "<policy>|<kind number>" -> records stored; "!dup" -> duplicates |
| `trimmed` | hash | stream name -> entries removed by retention; "round_stats" -> rounds dropped |
| `xfer` | hash | "<taker>|<source>|<kind number>" -> records delivered |
| `xr:<round>`, `xrounds` | hash, zset | the same counts per round of the records taken
  (`transfers.py`) |
| `metrics` | stream | per-round metric rows of the run's trainers (`runmetrics.py`) |
| `rounds` | zset | rounds that have REWARD_STATS (score = round) |
| `round` | zset | one member, "r", scored with the run's current round: the highest round its
  records and metric rows hold (ZADD GT; `mutualrl.common.bounds`' horizon counts from it) |
| `rs:<round>` | hash | "<prompt>|<policy>" -> "count,sum,sum_sq,max[,success_max]" |
| `succ:<prompt>` | hash | "<policy>|<text digest>" -> "|<round>:<record id>" per round that gave
  the text (the latest `layout.SUCCESS_ROUNDS_PER_TEXT`) of its VERIFIED_SUCCESS records |
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mutualrl.common import records
from mutualrl.common.keys import KeySpace
from mutualrl.v1 import experience_pb2 as pb

KINDS = records.KINDS
"""The record kinds, in enum order (one stream each)."""


def kind_name(kind: int) -> str:
    """The proto enum's name of a record kind ("ROLLOUT"); the number as text when unknown."""
    return pb.RecordKind.Name(kind) if kind in KINDS else str(kind)


class _Key:
    """A key of the run: `base` + a fixed suffix, read as an attribute."""

    def __init__(self, suffix: str) -> None:
        self.suffix = suffix

    def __get__(self, keys: RunKeys, owner: type) -> str:
        return keys.base + self.suffix


@dataclass(frozen=True)
class RunKeys:
    """All key names of one run."""

    prefix: str
    run_id: str
    base: str = field(init=False)
    """`<prefix>:see:{<run_id>}:`, the start of every key of the run."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "base", KeySpace(self.prefix, "see").run_base(self.run_id))

    pattern = _Key("*")
    """SCAN MATCH pattern of exactly this run's keys."""

    config = _Key("config")
    blobs = _Key("blobs")

    def stream(self, kind: int) -> str:
        return self.base + "s:" + kind_name(kind)

    batch_prefix = _Key("b:")

    def batch(self, string_id: str) -> str:
        """A string of one Publish batch's payloads (`string_id`: the batch's nonce, then the
        records' kind number)."""
        return self.batch_prefix + string_id

    rec_prefix = _Key("rec:")
    """Payload keys of the layout before batch strings (`rec:<record_id>`)."""

    def rec(self, record_id: str) -> str:
        return self.base + "rec:" + record_id

    idx = _Key("idx")
    lastid = _Key("lastid")
    counts = _Key("counts")
    trimmed = _Key("trimmed")
    xfer = _Key("xfer")
    rounds = _Key("rounds")
    current_round = _Key("round")

    round_stats_prefix = _Key("rs:")

    def round_stats(self, round_: int) -> str:
        return f"{self.base}rs:{round_}"

    def successes(self, prompt_id: str) -> str:
        return self.base + "succ:" + prompt_id

    def fixed(self) -> list[str]:
        """The keys the publish script always receives, in its KEYS order."""
        return [self.lastid, self.idx, self.counts, self.trimmed, self.config, self.rounds,
                *(self.stream(k) for k in KINDS), self.blobs]


def registry_key(prefix: str) -> str:
    """The set of every run id (`<prefix>:see:runs`)."""
    return KeySpace(prefix, "see").index("runs")
