"""A second `mutualrl up` of a run that has state: resume it, start it afresh, or refuse.

A run's state is on disk (each policy's checkpoints and metrics.jsonl under
`<output_dir>/<run_id>/`) and in SEE (its records, in Redis: the private Redis keeps them in
`<run dir>/redis`). `up` on such a run resumes every policy from its latest checkpoint (a policy
without one starts at round 0; each trainer drops the metrics rows of the rounds it runs again)
and trains up to `grpo.rounds`; `up --fresh` deletes the run (checkpoints, metrics, results, and
the run in SEE, THL and MWRA) and starts at round 0. It refuses, naming `--fresh`, a run file
that changed what the checkpoints and SEE's records are of (`IDENTITY`), and, in the
deterministic exchange, a SEE that lost the run's records: the resumed trainers would wait for
peer rounds nobody publishes again.

What SEE keeps over a resume: records of a round a trainer runs again are not stored twice (the
record ids are the same; SEE keeps the first, and in the deterministic mode the round replays
the same samples). Peer rollouts are handed out once per policy (a consumer group): a trainer
that resumes from a checkpoint older than its last round does not get again the rollouts it took
after that checkpoint, so PRP has fewer peer rows in the rounds it runs again; a clean stop
(SIGTERM, the end of the run) checkpoints the round it finished, and loses none.
"""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from mutualrl.trainer.config.run import TrainerConfig

IDENTITY = ("seed", "task", "grpo.group_size", "grpo.prompts_per_round")
"""Run-level fields a resumed run must keep: they decide the problems of every round and the
shape of the records SEE holds."""
POLICY_IDENTITY = ("preset", "model_path", "sft_checkpoint", "lora")
"""Policy fields a resumed policy must keep: its checkpoints are of these weights."""
KEPT_ON_FRESH = ("warm_start", "logs")
"""Run-directory entries `--fresh` leaves: warm starts are reused by design; logs append."""


class ResumeRefused(ValueError):
    """`up` cannot resume the run as configured; the message says why and names `--fresh`."""


@dataclass
class PriorRun:
    """What a run directory holds from earlier `up`s."""

    rounds: dict[str, int]
    """Per policy: rounds done at its latest checkpoint (0 without one)."""
    logged: dict[str, int]
    """Per policy: rows in its metrics.jsonl."""

    @property
    def resumes(self) -> bool:
        return any(self.rounds.values()) or any(self.logged.values())

    def describe(self) -> str:
        return ", ".join(f"{p} from round {k}" for p, k in self.rounds.items())


def prior_run(cfg: TrainerConfig, run_dir: Path) -> PriorRun:
    """The checkpoints and metrics rows each policy of `cfg` has in `run_dir`."""
    from mutualrl.trainer.runtime import checkpoint

    rounds, logged = {}, {}
    for policy in cfg.policies:
        base = run_dir / policy.name
        last = checkpoint.latest(base / "checkpoints")
        rounds[policy.name] = checkpoint.round_of(last) if last is not None else 0
        metrics = base / "metrics.jsonl"
        logged[policy.name] = (sum(1 for line in metrics.open(encoding="utf-8") if line.strip())
                               if metrics.exists() else 0)
    return PriorRun(rounds=rounds, logged=logged)


def _field(cfg: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        cfg = getattr(cfg, part)
    return cfg.model_dump(mode="json") if hasattr(cfg, "model_dump") else cfg


def identity_changes(before: TrainerConfig, now: TrainerConfig,
                     warm_started: Collection[str] = ()) -> list[str]:
    """The fields whose change makes the run another run (`IDENTITY`, `POLICY_IDENTITY` of
    every policy that has state), as `field: before -> now`. `warm_started`: policies whose
    `sft_checkpoint` `up` sets itself (an `up.warm_start` entry), not compared."""
    out = [f"trainer.{name}: {_short(_field(before, name))} -> {_short(_field(now, name))}"
           for name in IDENTITY if _field(before, name) != _field(now, name)]
    old = {p.name: p for p in before.policies}
    for i, policy in enumerate(now.policies):
        prev = old.get(policy.name)
        if prev is None:
            continue
        for name in POLICY_IDENTITY:
            if name == "sft_checkpoint" and policy.name in warm_started:
                continue
            a, b = _field(prev, name), _field(policy, name)
            if a != b:
                out.append(f"trainer.policies[{i}].{name} ({policy.name}): {_short(a)} -> "
                           f"{_short(b)}")
    return out


def _short(value: Any, limit: int = 80) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def check_resumable(previous_yaml: Path, cfg: TrainerConfig, config: Path,
                    warm_started: Collection[str] = ()) -> None:
    """Raise ResumeRefused when the run file `config` changed the run's identity against
    the effective run file an earlier `up` wrote (`previous_yaml`)."""
    from mutualrl.common.config import load_yaml
    from mutualrl.trainer.config.run import TrainerConfig

    if not previous_yaml.exists():
        return
    before = TrainerConfig.model_validate(load_yaml(previous_yaml).get("trainer") or {})
    changes = identity_changes(before, cfg, warm_started)
    if changes:
        raise ResumeRefused(
            f"run {cfg.run_id} in {previous_yaml.parent} was trained with another "
            f"{'; '.join(changes)}; its checkpoints and records are of that run. Resume "
            f"it with the run file it was started with, or start it again from round 0 with "
            f"`mutualrl up -c {config} --fresh` (deletes its checkpoints, metrics and records), "
            f"or give the new run another trainer.run_id")


def running_up(run_dir: Path) -> int | None:
    """The pid of a process an earlier `up` of this run started that still runs (that `up` is
    alive: its children die with it), else None."""
    state_path = run_dir / "up.json"
    if not state_path.exists():
        return None
    try:
        state = json.loads(state_path.read_text())
    except (OSError, ValueError):
        return None
    if state.get("stopped", True):
        return None
    for pid in (state.get("pids") or {}).values():
        try:
            os.kill(int(pid), 0)
        except (ProcessLookupError, PermissionError, ValueError, TypeError):
            continue
        try:
            if "mutualrl" in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                return int(pid)
        except OSError:
            return int(pid)
    return None


def wipe(run_dir: Path) -> list[str]:
    """Delete what the run directory holds of earlier runs but warm starts and logs (`--fresh`);
    returns the names removed."""
    removed: list[str] = []
    if not run_dir.exists():
        return removed
    for entry in sorted(run_dir.iterdir()):
        if entry.name in KEPT_ON_FRESH:
            continue
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()
        removed.append(entry.name)
    return removed


def missing_rounds(rest_url: str, run_id: str, prior: PriorRun, token: str | None
                   ) -> list[str]:
    """Policies whose last checkpointed round SEE does not hold (as `policy round k`): SEE
    lost the run (a new Redis) or trimmed it. Read through SEE's REST API."""
    import urllib.error
    import urllib.parse
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    out = []
    for policy, rounds in prior.rounds.items():
        if rounds == 0:
            continue
        query = urllib.parse.urlencode({"kind": "REWARD_STATS", "policy": policy,
                                        "round_min": rounds - 1, "round_max": rounds - 1,
                                        "limit": 1})
        request = urllib.request.Request(f"{rest_url}/v1/runs/{run_id}/records?{query}",
                                         headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as reply:
                found = json.loads(reply.read())["records"]
        except urllib.error.HTTPError as err:
            if err.code != 404:
                raise
            found = []
        if not found:
            out.append(f"{policy} round {rounds - 1}")
    return out
