"""Redis key layout of SEE (pure).

Every key of a run carries the run id as a hash tag (`<prefix>:{<run_id>}:...`) so a run lives
in one Redis Cluster slot and one Lua script may touch all of its keys. Only the registry of run
ids (`<prefix>:runs`) is global.

| key | type | holds |
|---|---|---|
| `config` | string | serialized `Run` (config + creation time) |
| `s:<KIND>` | stream | one entry per record of that kind; field h = "rid, policy, prompt, round,
  verified, version" joined by \x1f (filters read it without touching the payload) |
| `rec:<record_id>` | string | the serialized ExperienceRecord (exactly as the client sent it,
  plus run_id and created_unix_ms) |
| `idx` | hash | record_id -> "<kind number>:<stream id>" (the idempotency index) |
| `lastid` | string | last stream id issued; ids are unique across the run's three streams |
| `counts` | hash | "<policy>|<kind number>" -> records stored; "!dup" -> duplicates |
| `trimmed` | hash | stream name -> entries removed by retention; "round_stats" -> rounds dropped |
| `xfer` | hash | "<taker>|<source>|<kind number>" -> records delivered |
| `xr:<round>`, `xrounds` | hash, zset | the same counts per round of the records taken
  (`transfers.py`) |
| `metrics` | stream | per-round metric rows of the run's trainers (`runmetrics.py`) |
| `rounds` | zset | rounds that have REWARD_STATS (score = round) |
| `rs:<round>` | hash | "<prompt>|<policy>" -> "count,sum,sum_sq,max" |
| `succ:<prompt>` | hash | "<policy>|<text digest>" -> record id of a VERIFIED_SUCCESS |
"""

from __future__ import annotations

from dataclasses import dataclass

from mutualrl.v1 import experience_pb2 as pb

KINDS: tuple[int, ...] = (pb.ROLLOUT, pb.REWARD_STATS, pb.VERIFIED_SUCCESS)
STREAM_NAMES: dict[int, str] = {pb.ROLLOUT: "ROLLOUT", pb.REWARD_STATS: "REWARD_STATS",
                                pb.VERIFIED_SUCCESS: "VERIFIED_SUCCESS"}


@dataclass(frozen=True)
class RunKeys:
    """All key names of one run."""

    prefix: str
    run_id: str

    @property
    def base(self) -> str:
        return f"{self.prefix}:{{{self.run_id}}}:"

    @property
    def config(self) -> str:
        return self.base + "config"

    def stream(self, kind: int) -> str:
        return self.base + "s:" + STREAM_NAMES[kind]

    @property
    def rec_prefix(self) -> str:
        return self.base + "rec:"

    def rec(self, record_id: str) -> str:
        return self.base + "rec:" + record_id

    @property
    def idx(self) -> str:
        return self.base + "idx"

    @property
    def lastid(self) -> str:
        return self.base + "lastid"

    @property
    def counts(self) -> str:
        return self.base + "counts"

    @property
    def trimmed(self) -> str:
        return self.base + "trimmed"

    @property
    def xfer(self) -> str:
        return self.base + "xfer"

    @property
    def rounds(self) -> str:
        return self.base + "rounds"

    @property
    def round_stats_prefix(self) -> str:
        return self.base + "rs:"

    def round_stats(self, round_: int) -> str:
        return f"{self.base}rs:{round_}"

    def successes(self, prompt_id: str) -> str:
        return self.base + "succ:" + prompt_id

    def fixed(self) -> list[str]:
        """The keys the publish script always receives, in its KEYS order."""
        return [self.lastid, self.idx, self.counts, self.trimmed, self.config, self.rounds,
                *(self.stream(k) for k in KINDS)]


def registry_key(prefix: str) -> str:
    return f"{prefix}:runs"
