"""Transfer counts per round: which policy took how many records of each kind from which peer,
so the transfer matrix can be read over a window of rounds (GetRunStats holds the run totals).

A transfer is counted when SEE hands a record to a taker (FetchRollouts, GetRoundStats,
GetVerifiedSuccesses), under the round *of the record taken* (for REWARD_STATS, the round
asked for). Keys, next to the run-total hash `xfer`:

| key | type | holds |
|---|---|---|
| `xr:<round>` | hash | "<taker>|<source>|<kind number>" -> records of that round delivered |
| `xrounds` | zset | rounds that have a `xr:<round>` hash (score = round) |

Totals and per-round counts are written in one MULTI/EXEC, so the per-round counts of every
round always add up to GetRunStats' transfers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from mutualrl.see.keys import RunKeys

_ROUNDS_PER_READ = 64


def round_key(rk: RunKeys, round_: int) -> str:
    return f"{rk.base}xr:{round_}"


def rounds_key(rk: RunKeys) -> str:
    return rk.base + "xrounds"


def queue_counts(pipe: Any, rk: RunKeys, taker: str, kind: int,
                 taken: Mapping[tuple[str, int], int], ttl: int) -> None:
    """Queue on `pipe` the increments for `taken`: (source policy, round) -> records."""
    rounds: set[int] = set()
    for (source, round_), n in taken.items():
        pipe.hincrby(rk.xfer, f"{taker}|{source}|{kind}", n)
        pipe.hincrby(round_key(rk, round_), f"{taker}|{source}|{kind}", n)
        rounds.add(round_)
    if rounds:
        pipe.zadd(rounds_key(rk), {str(r): r for r in rounds})
    for r in rounds:
        pipe.expire(round_key(rk, r), ttl)
    pipe.expire(rk.xfer, ttl)
    pipe.expire(rounds_key(rk), ttl)


async def window(client: Any, rk: RunKeys, round_min: int, round_max: int
                 ) -> dict[tuple[str, str, int], int]:
    """(taker, source, kind) -> records of rounds round_min..round_max (inclusive) delivered.
    Read `_ROUNDS_PER_READ` rounds at a time: what is held is the sum (at most 3 x policies^2
    counts) and one read's hashes, whatever the window."""
    rounds = await client.zrangebyscore(rounds_key(rk), round_min, round_max)
    out: dict[tuple[str, str, int], int] = {}
    for i in range(0, len(rounds), _ROUNDS_PER_READ):
        async with client.pipeline(transaction=False) as pipe:
            for r in rounds[i:i + _ROUNDS_PER_READ]:
                pipe.hgetall(round_key(rk, int(r)))
            hashes = await pipe.execute()
        for h in hashes:
            for fld, val in h.items():
                taker, source, kind = (fld.decode() if isinstance(fld, bytes)
                                       else fld).split("|")
                k = (taker, source, int(kind))
                out[k] = out.get(k, 0) + int(val)
    return out


async def round_range(client: Any, rk: RunKeys) -> tuple[int, int] | None:
    """First and last round with transfers, or None when nothing was taken yet."""
    first = await client.zrange(rounds_key(rk), 0, 0, withscores=True)
    last = await client.zrange(rounds_key(rk), -1, -1, withscores=True)
    if not first or not last:
        return None
    return int(first[0][1]), int(last[0][1])
