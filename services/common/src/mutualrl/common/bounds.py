"""Bounds on the numbers clients send that the services store, count, sum or compare (pure).

Each bound is what the arithmetic downstream can hold, so a value that passes it can never
overflow, lose precision or turn a pooled statistic into inf, whoever sends it:

- rounds and policy versions (`MAX_ROUND`, `MAX_POLICY_VERSION`: 2^31 - 1) travel through Redis
  sorted-set scores and Lua numbers (doubles, exact to 2^53), JSON read by browsers (exact to
  2^53), and int32 numpy arrays and seeds in trainers; 2^31 rounds is 68 years at one round a
  second;
- a round is also held to a horizon of the run's current round (`check_round`): the highest
  round the run's state holds (SEE: its records and metric rows; MWRA: its plan and step-cost
  reports), plus a configurable number of rounds ahead (`max_round_ahead` of SEE and MWRA). A
  run that holds no round yet takes any round up to `MAX_ROUND` first (a resumed run whose state
  was deleted starts where it left). One client cannot pin a run's plan or round statistics at
  a round nobody reaches;
- a REWARD_STATS `count` (the rewards of one policy's group for one prompt in one round) is at
  most `MAX_GROUP_SIZE` (2^20): pooled over a run's at most 256 policies it stays below 2^28,
  far from any integer type's limit and exact in a double;
- a reward, a stats `max` and `sum / count` lie within +-`MAX_ABS_REWARD` (1e9), so `sum_sq`
  is at most count x 1e18 and a pool's sum of squares at most 2.7e26: finite also in float32
  (3.4e38), where trainers compute advantages;
- other counts (tokens, samples) and Unix-ms times are at most `MAX_COUNT` (2^53 - 1), exact in
  a double, in JSON and in Lua.
"""

from __future__ import annotations

from mutualrl.common.errors import InvalidArgument

MAX_ROUND = 2**31 - 1
"""Largest round of a run's shared prompt order any service accepts."""
MAX_POLICY_VERSION = 2**31 - 1
"""Largest policy version (optimizer steps taken) a record may carry."""
MAX_GROUP_SIZE = 1 << 20
"""Largest REWARD_STATS count: rewards of one policy's group for one prompt and round."""
MAX_ABS_REWARD = 1e9
"""Largest reward magnitude (a record's reward, a stats max and mean)."""
MAX_COUNT = 2**53 - 1
"""Largest token or sample count and Unix-ms time."""
DEFAULT_MAX_ROUND_AHEAD = 1024
"""Rounds past a run's current round a request may name, unless configured otherwise."""


def check_int(value: int, field: str, most: int, least: int = 0) -> int:
    """`value` unchanged, or InvalidArgument naming `field` when outside [least, most]."""
    if value < least:
        raise InvalidArgument(field, f"must be >= {least}, got {value}")
    if value > most:
        raise InvalidArgument(field, f"must be <= {most}, got {value}")
    return value


def check_round(value: int, field: str, current: int | None, ahead: int) -> int:
    """A round of a run whose current round is `current` (None: the run holds none yet): in
    [0, MAX_ROUND], and at most `ahead` rounds past `current`."""
    check_int(value, field, MAX_ROUND)
    if current is not None and value > current + ahead:
        raise InvalidArgument(field, f"round {value} is more than {ahead} rounds past the "
                              f"run's current round {current} (max_round_ahead)")
    return value
