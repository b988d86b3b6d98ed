"""What a trainer exchanges with its peers, over SEE (records) and THL (tokens).

`PeerExchange` is the only place the trainer touches the wire for sharing: it publishes a
round's records, reads peers' reward statistics / successes / rollouts, and asks THL (the
service, or the same engine in-process) to move peer text and token traces into this policy's
tokens. Every SEE read takes an absolute deadline (time.monotonic) and passes what is left of it
as the gRPC timeout and, in the asynchronous mode, as its outage budget, so a slow or dead peer
or service turns into DEADLINE_EXCEEDED or UNAVAILABLE by then, which the probe answers with
plain GRPO. Publishes, THL calls (local computation) and the deterministic mode's reads ride out
a service's outage for the client's whole outage budget (`services.outage_budget_s`).

The deterministic mode (`exchange.mode`, docs/determinism.md) waits instead: `await_round`
blocks until every peer has published a round, up to a liveness bound past which the run
fails, and its publishes and peer reads can run in the background (`publish_soon`,
`submit`), each kind on its own thread, in order.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import grpc
from transformers import PreTrainedTokenizerFast

from mutualrl.client.see import SeeClient
from mutualrl.client.thl import ThlClient
from mutualrl.common import records as rules
from mutualrl.common import token_arrays as ta
from mutualrl.common.alignment_types import TraceItem
from mutualrl.common.auth import claimed_policy
from mutualrl.common.channel import DEFAULT_OUTAGE_BUDGET, ClientOptions
from mutualrl.common.errors import InvalidArgument
from mutualrl.thl.engine import AlignmentEngine
from mutualrl.trainer.algos.sgt import PeerSuccess
from mutualrl.trainer.algos.xgrpo import RewardStats
from mutualrl.trainer.sharing.record_ids import rollout_id, stats_id, success_id
from mutualrl.v1 import experience_pb2 as pb

log = logging.getLogger(__name__)
_MARGIN_S = 0.05  # leave the client this much to receive the answer of a server-side wait
_POLL_S = 30.0  # one server-side wait of `await_round` (SEE caps a wait at its max_wait_ms)
_STOP_POLL_S = 2.0  # ... of a wait that ends when the trainer is asked to stop
T = TypeVar("T")
_RETRIED = frozenset({"UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED"})


class PeerTimeout(RuntimeError):
    """Peers did not publish a round within the liveness bound (`missing`: which)."""

    def __init__(self, message: str, missing: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)


class RecordError(ValueError):
    """A record this trainer built breaks SEE's record rules (`mutualrl.common.records`)."""


class PublishError(RuntimeError):
    """Publishes failed past `exchange.max_failed_publishes` in a row: the run shares nothing."""


@dataclass
class PeerRollout:
    """A peer's sampled completion with its behaviour log-probs in the peer's tokens."""

    delivery_id: str
    policy: str
    round: int
    prompt_id: str
    text: str
    tokenizer_id: str
    token_ids: list[int]
    offsets: list[tuple[int, int]]
    logprobs: list[float]
    reward: float
    stopped_by_eos: bool = False
    """The sender's generation ended with its EOS token (the last of `token_ids`; the text,
    decoded without special tokens, does not show it)."""
    record_id: str = ""
    """SEE record id (`<policy>/<round>/<prompt>/<sample>/r`): a fixed order of the peer's
    samples, unlike the stream's delivery ids."""
    truncated: bool = False
    """The sender's token budget ran out (finish reason LENGTH): never a success."""


@dataclass
class AlignedPeer:
    """A peer completion in the receiver's tokens with the sender's log-probs mapped on it."""

    token_ids: list[int]
    sender_logp_sum: float
    """Sum of the sender's token log-probs over the whole text (mass conserved by THL)."""
    sender_tokens: int = 0
    """How many sender tokens `sender_logp_sum` covers (its EOS included when it counts)."""
    token_chunk: list[int] = field(default_factory=list)
    """Chunk index of every receiver token (chunk level only)."""
    chunk_sender_logp: list[float] = field(default_factory=list)
    """Sender log-prob of every chunk (chunk level only)."""
    multi_token_chunk_share: float = 0.0
    """THL residual: share of receiver tokens inside multi-token chunks."""


def _describe(err: grpc.RpcError) -> str:
    code, details = getattr(err, "code", None), getattr(err, "details", None)
    return f"{code().name}: {details()}" if code and details else str(err)


def remaining(deadline: float) -> float:
    """Seconds left before `deadline` (never below 1 ms, so a call still gets a chance)."""
    return max(deadline - time.monotonic(), 0.001)


class PeerExchange:
    """SEE (through `mutualrl.client.see`) and THL for one policy of one run."""

    def __init__(
        self,
        run_id: str,
        policy: str,
        tokenizer_id: str,
        see_address: str,
        thl_address: str | None,
        local_tokenizer: PreTrainedTokenizerFast,
        token: str | None = None,
        timeout: float = 30.0,
        tau: float = 1.0,
        outage_budget: float = DEFAULT_OUTAGE_BUDGET,
        reads_within_deadline: bool = True,
        max_failed_publishes: int = 3,
    ) -> None:
        self.run_id, self.policy, self.tokenizer_id = run_id, policy, tokenizer_id
        self.tau = tau
        self.scoped = claimed_policy(token) is not None
        """This trainer holds a policy token: it may not create the run, only find it."""
        self.reads_within_deadline = reads_within_deadline
        """The asynchronous mode: a probe's read ends by the round's deadline, a SEE outage
        included (the round falls back to GRPO). Otherwise (the deterministic mode, which
        must read) a read rides out an outage for the whole outage budget."""
        self._tok = local_tokenizer
        opts = ClientOptions(address=see_address, token=token, timeout=timeout,
                             outage_budget=outage_budget)
        # Reads pass what is left of the round's deadline as each attempt's timeout; a SEE or
        # THL that restarts is retried past it, within the outage budget.
        self.client = SeeClient(opts)
        # THL over gRPC, or the same engine in-process (identical interface) without an address.
        self.thl: ThlClient | AlignmentEngine
        if thl_address is not None:
            self.thl = ThlClient(opts, address=thl_address)
        else:
            self.thl = AlignmentEngine()
        self.publish_failures = 0
        """Publishes that failed in a row (reset by one that succeeds)."""
        self.max_failed_publishes = max_failed_publishes
        self.published = 0
        """Records SEE acknowledged (stored or already there) from this trainer."""
        self.run_config = pb.RunConfig(run_id=run_id, policies=[policy], tau=tau)
        """What this trainer's records are checked against before they are sent (`join`
        sets the run's policies)."""
        self.stop_requested: Callable[[], bool] = lambda: False
        """True once this trainer is asked to stop (SIGTERM; the loop sets it)."""
        self.waited_s = 0.0
        """Seconds spent in bounded waits for peers to publish a round (up to a deadline)."""
        self._background: dict[str, ThreadPoolExecutor] = {}
        self._published: list[Future[Any]] = []
        self.consumer = f"{policy}-trainer"
        self.last_delivery_id = ""
        """Stream id of the last peer rollout acknowledged (saved with checkpoints)."""

    # ---- set-up ---------------------------------------------------------------------------
    def join(self, policies: Sequence[str], tokenizers: dict[str, str],
             run_wait_s: float = 30.0) -> None:
        """Create the run (idempotent) and register tokenizers (id -> local path) with THL:
        this policy's own with a THL service (each trainer registers its own), every policy's
        with the in-process engine (which knows only what this process registers). They are
        registered for this run: THL's DeleteRun of the run releases them.

        Creating takes the run's secret; with a policy token (which is not even tried: a
        trainer calls nothing its token may not) the run must exist already, made by whoever
        holds the secret (`mutualrl up` and `mutualrl create-run` do), and list this policy
        (`mutualrl.see.grpc.access`); it is waited for up to `run_wait_s` seconds."""
        self.run_config = pb.RunConfig(run_id=self.run_id, policies=list(policies), tau=self.tau)
        if self.scoped:
            self._check_run_exists(run_wait_s)
        else:
            try:
                self.client.create_run(self.run_id, list(policies), self.tau, exist_ok=True)
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.PERMISSION_DENIED:
                    raise
                self._check_run_exists(run_wait_s)
        for tid, path in tokenizers.items():
            self.thl.register(tid, path, overwrite=True, run_id=self.run_id)

    def _check_run_exists(self, wait_s: float) -> None:
        """Wait up to `wait_s` for the run to appear (a deployment's run-init job may still be
        creating it), then check it lists this policy."""
        deadline = time.monotonic() + wait_s
        while True:
            try:
                run = self.client.get_run(self.run_id)
                break
            except grpc.RpcError as err:
                if err.code() != grpc.StatusCode.NOT_FOUND:
                    raise
                if time.monotonic() >= deadline:
                    raise RuntimeError(
                        f"run {self.run_id!r} does not exist in SEE and this trainer's token may "
                        "not create it (a policy token): create the run with the run's secret "
                        "first (`mutualrl up` and `mutualrl create-run` do)") from None
                time.sleep(1.0)
        if self.policy not in run.config.policies:
            raise RuntimeError(f"run {self.run_id!r} in SEE does not list policy {self.policy!r}"
                               f" (it lists {', '.join(run.config.policies)})")

    def close(self) -> None:
        for pool in self._background.values():
            pool.shutdown(wait=True, cancel_futures=True)
        self.client.close()
        if hasattr(self.thl, "close"):
            self.thl.close()

    # ---- publish --------------------------------------------------------------------------
    def check(self, records: Sequence[Any]) -> None:
        """Raise RecordError unless every record keeps SEE's rules, checked with SEE's own code
        against SEE's default limits: a record SEE would refuse is this trainer's error, found
        before it is sent."""
        try:
            rules.validate_records(records, self.run_config, rules.DEFAULT_LIMITS)
        except InvalidArgument as err:
            raise RecordError(f"policy {self.policy!r} built a record SEE refuses: {err}"
                              ) from None

    def publish(self, records: list[Any]) -> bool:
        """Publish a round's records (checked first; idempotent per record id). A failure
        (after the client's retries) is logged and counted: peers miss one round of this
        policy's data, which is what their deadline is for, and training goes on, until
        `max_failed_publishes` rounds in a row failed: then PublishError ends the run, which
        was asked to share and shares nothing."""
        self.check(records)
        try:
            self._send(records)
            return True
        except grpc.RpcError as err:
            self._failed(len(records), err)
            return False

    def _send(self, records: list[Any]) -> None:
        self.client.publish(self.run_id, records)
        self.published += len(records)
        self.publish_failures = 0

    def _failed(self, n: int, err: grpc.RpcError) -> None:
        self.publish_failures += 1
        what = _describe(err)
        if self.publish_failures >= self.max_failed_publishes:
            raise PublishError(
                f"policy {self.policy!r}: {self.publish_failures} publishes in a row failed "
                f"(exchange.max_failed_publishes={self.max_failed_publishes}); last: {what}"
            ) from None
        log.warning("publish of %d records failed (%d in a row): %s", n,
                    self.publish_failures, what)

    # ---- the background (deterministic mode) ------------------------------------------------
    def submit(self, fn: Callable[[], T], lane: str = "read") -> Future[T]:
        """Run `fn` in the background after what was submitted to the same `lane` before: one
        thread for peer reads, one for publishes, so neither waits for the other."""
        if lane not in self._background:
            self._background[lane] = ThreadPoolExecutor(
                1, thread_name_prefix=f"{self.policy}-{lane}")
        return self._background[lane].submit(fn)

    def publish_soon(self, records: list[Any]) -> None:
        """Publish in the background (checked first), in order; a failure (after the client's
        retries) raises from the next `flush`: peers wait for these records, so they must not
        be dropped."""
        self.check(records)

        def send() -> None:
            try:
                self._send(records)
            except grpc.RpcError as err:
                self.publish_failures += 1
                raise PublishError(
                    f"policy {self.policy!r}: a publish of {len(records)} records failed, and "
                    f"the deterministic mode's peers wait for them: {_describe(err)}") from None
        self._published.append(self.submit(send, lane="publish"))

    def flush(self) -> None:
        """Wait for the background publishes; raise the first that failed."""
        done, self._published = self._published, []
        for f in done:
            f.result()

    def await_round(self, round_k: int, prompt_ids: Sequence[str], timeout_s: float,
                    expect: Sequence[str] | None = None, may_stop: bool = False) -> float:
        """Block until every expected policy (None: every policy of the run) has published its
        REWARD_STATS of `round_k` for `prompt_ids` (a round's stats are its last records), or
        raise PeerTimeout after `timeout_s`. SEE being unreachable counts against the same
        bound: the wait retries. `may_stop`: a wait the round can do without (the asynchronous
        mode's lead) also ends, with PeerTimeout, within a poll of `stop_requested` turning
        true, so a trainer asked to stop is not held by peers that will not come. Returns the
        seconds waited."""
        t0 = time.monotonic()
        give_up = t0 + timeout_s
        missing: list[str] = []
        error = ""
        while True:
            if may_stop and self.stop_requested():
                raise PeerTimeout(f"round {round_k}: asked to stop while waiting for the peers' "
                                  f"round {round_k}", missing)
            left = give_up - time.monotonic()
            wait = max(min(left, _STOP_POLL_S if may_stop else _POLL_S), 0.0)
            try:
                # As this policy (all its token may ask), a wait only: a poll takes nothing.
                resp = self.client.round_stats(
                    self.run_id, round_k, list(prompt_ids), policy_id=self.policy,
                    wait_only=True, wait_ms=int(max(wait - _MARGIN_S, 0.0) * 1000),
                    expect_policies=list(expect or []), timeout=wait + 5.0)
                if resp.complete:
                    return time.monotonic() - t0
                missing, error = list(resp.missing_policies), ""
            except grpc.RpcError as err:
                if err.code().name not in _RETRIED:
                    raise
                error = f"; last SEE error: {err.code().name}: {err.details()}"
                time.sleep(min(1.0, max(left, 0.0)))
            if time.monotonic() >= give_up:
                who = ", ".join(missing) if missing else "some peers"
                raise PeerTimeout(
                    f"round {round_k}: {who} did not publish their records of round "
                    f"{round_k} within exchange.liveness_timeout_s={timeout_s:g} s "
                    f"(exchange.mode deterministic waits for every peer; a dead peer "
                    f"fails the run: restart it with --resume){error}", missing)

    # ---- reads for the probes -------------------------------------------------------------
    def _outage_budget(self, deadline: float) -> float | None:
        """A read's outage budget: what is left of the round (`reads_within_deadline`), else
        the client's."""
        return remaining(deadline) if self.reads_within_deadline else None

    def peer_stats(
        self, round_k: int, prompt_ids: Sequence[str], deadline: float,
        expect: Sequence[str] | None = None,
    ) -> tuple[dict[str, RewardStats], dict[str, float], bool]:
        """Pooled peer reward stats per prompt (own excluded), peers' max reward per prompt,
        and whether every expected peer had published when the call returned (waits up to
        deadline). `expect`: the policies to wait for (None: every policy of the run)."""
        resp = self._round_stats(round_k, prompt_ids, deadline, expect)
        pooled: dict[str, RewardStats] = {}
        best: dict[str, float] = {}
        for prompt_id, _, s in self._peer_entries(resp):
            pooled[prompt_id] = pooled.get(prompt_id, RewardStats()).merge(_reward_stats(s))
            top = s.success_max if s.HasField("success_max") else s.max
            best[prompt_id] = max(best.get(prompt_id, float("-inf")), float(top))
        return pooled, best, bool(resp.complete)

    def _peer_entries(self, resp: Any) -> Iterator[tuple[str, str, Any]]:
        """(prompt id, peer, its RewardStats message) of each peer's entry of a GetRoundStats
        answer; this policy's own entries are left out."""
        for p in resp.prompts:
            for ps in p.policies:
                if ps.policy_id != self.policy:
                    yield p.prompt_id, ps.policy_id, ps.stats

    def _round_stats(self, round_k: int, prompt_ids: Sequence[str], deadline: float,
                     expect: Sequence[str] | None) -> Any:
        """SEE's reward stats of round `round_k` for `prompt_ids` as this policy sees them,
        waiting (bounded by `deadline`, counted in `waited_s`) for the expected policies."""
        left = remaining(deadline)
        t0 = time.monotonic()
        try:
            return self.client.round_stats(
                self.run_id, round_k, list(prompt_ids), policy_id=self.policy,
                wait_ms=int(max(left - _MARGIN_S, 0.0) * 1000),
                expect_policies=list(expect or []), timeout=left + 1.0,
                outage_budget=self._outage_budget(deadline))
        finally:
            self.waited_s += time.monotonic() - t0

    def policy_stats(
        self, round_k: int, prompt_ids: Sequence[str], deadline: float,
        expect: Sequence[str] | None = None,
    ) -> tuple[dict[str, RewardStats], bool]:
        """Each peer's reward stats of round `round_k` pooled over `prompt_ids` (own excluded;
        peers that published none are absent), and whether every expected peer had published
        when the call returned (waits up to deadline, as `peer_stats`)."""
        resp = self._round_stats(round_k, prompt_ids, deadline, expect)
        per_policy: dict[str, RewardStats] = {}
        for _, peer, s in self._peer_entries(resp):
            per_policy[peer] = per_policy.get(peer, RewardStats()).merge(_reward_stats(s))
        return per_policy, bool(resp.complete)

    def peer_successes(
        self, prompt_ids: Sequence[str], min_round: int, max_per_prompt: int, deadline: float,
        max_round: int | None = None,
    ) -> list[PeerSuccess]:
        """Peers' verified successes for these prompts (SEE never returns own ones), of rounds
        min_round .. max_round (None: any later one too). SEE orders them by round, policy and
        record id before it caps them, so the bound on later rounds keeps the same set."""
        if not prompt_ids:
            return []
        by_prompt = self.client.successes(
            self.run_id, self.policy, list(prompt_ids), max_per_prompt=max_per_prompt,
            min_round=min_round, timeout=remaining(deadline),
            outage_budget=self._outage_budget(deadline))
        return [
            PeerSuccess(
                prompt_id=prompt_id, policy=r.policy_id, text=r.text, reward=r.reward,
                truncated=r.finish_reason == pb.FINISH_REASON_LENGTH, verified=r.verified,
                stopped_by_eos=r.finish_reason == pb.FINISH_REASON_EOS)
            for prompt_id, records in by_prompt.items()
            for r in records
            if max_round is None or r.round <= max_round
        ]

    def peer_rollouts(
        self, round_k: int, max_lag: int, max_records: int, deadline: float
    ) -> list[PeerRollout]:
        """Unread peer ROLLOUTs of rounds >= round_k - max_lag (acknowledged on read: a record
        is offered once; the consumer group position lives in SEE), up to `max_records` over as
        many pages as SEE's byte budget makes of them."""
        out: list[PeerRollout] = []
        while len(out) < max_records:
            resp = self.client.fetch_rollouts(
                self.run_id, self.policy, self.consumer, max_records=max_records - len(out),
                block_ms=0, current_round=round_k, max_round_lag=max_lag,
                timeout=remaining(deadline), outage_budget=self._outage_budget(deadline))
            page = [
                PeerRollout(
                    delivery_id=d.delivery_id, policy=d.record.policy_id, round=d.record.round,
                    prompt_id=d.record.prompt_id, text=d.record.text,
                    tokenizer_id=d.record.tokenizer_id,
                    token_ids=ta.token_ids(d.record).tolist(),
                    offsets=list(zip(ta.offset_starts(d.record).tolist(),
                                     ta.offset_ends(d.record).tolist(), strict=True)),
                    logprobs=ta.logprobs(d.record).tolist(), reward=d.record.reward,
                    stopped_by_eos=d.record.finish_reason == pb.FINISH_REASON_EOS,
                    record_id=d.record.record_id,
                    truncated=d.record.finish_reason == pb.FINISH_REASON_LENGTH)
                for d in resp.deliveries
            ]
            if page:
                ids = [r.delivery_id for r in page]
                self.client.ack(self.run_id, self.policy, ids, timeout=remaining(deadline),
                                outage_budget=self._outage_budget(deadline))
                self.last_delivery_id = ids[-1]
            out += page
            if not resp.more or not page:
                return out
        return out

    # ---- tokens (THL) -----------------------------------------------------------------------
    @property
    def eos_token_id(self) -> int | None:
        """This policy's end-of-sequence token (appended where a sender stopped by its own)."""
        eos = getattr(self._tok, "eos_token_id", None)
        return int(eos) if eos is not None else None

    def retokenize(self, texts: Sequence[str], ends: Sequence[bool] | None = None
                   ) -> list[list[int]]:
        """Texts in this policy's tokens (completion-style: no special tokens); where `ends[i]`
        (the sender stopped by EOS), this policy's EOS follows, so the receiver learns to stop
        where the sender did."""
        if not texts:
            return []
        out = [r.token_ids.tolist() for r in self.thl.retokenize(self.tokenizer_id, texts)]
        eos = self.eos_token_id
        if ends is not None and eos is not None:
            out = [[*ids, eos] if end else ids for ids, end in zip(out, ends, strict=True)]
        return out

    def align(self, rollouts: Sequence[PeerRollout], chunk_level: bool) -> list[AlignedPeer]:
        """Move peer token traces (behaviour log-probs) onto this policy's tokens, one THL
        call per source tokenizer; results keep the order of `rollouts`.

        A sender's final EOS has no text, so THL aligns the text tokens only; the end of
        sequence is then a chunk of its own: this policy's EOS against the sender's log p(EOS).
        Both sides' sums then cover the same text and the same stop (without an EOS of this
        policy, neither side counts one)."""
        slots: list[AlignedPeer | None] = [None] * len(rollouts)
        by_source: dict[str, list[int]] = {}
        for i, r in enumerate(rollouts):
            by_source.setdefault(r.tokenizer_id, []).append(i)
        eos = self.eos_token_id
        for source, idx in by_source.items():
            text_len = [len(rollouts[i].token_ids)
                        - int(rollouts[i].stopped_by_eos and bool(rollouts[i].token_ids))
                        for i in idx]
            items = [TraceItem(text=rollouts[i].text,
                               source_token_ids=rollouts[i].token_ids[:n],
                               values=rollouts[i].logprobs[:n],
                               source_offsets=rollouts[i].offsets[:n])
                     for i, n in zip(idx, text_len, strict=True)]
            res = self.thl.align_trace(source, self.tokenizer_id, items, mode="chunk")
            for i, n, tr in zip(idx, text_len, res.results, strict=True):
                ch = tr.chunks
                token_ids = tr.target_token_ids.tolist()
                token_chunk = [0] * len(token_ids)
                for c in range(len(ch)):
                    for t in range(int(ch.target_start[c]), int(ch.target_end[c])):
                        token_chunk[t] = c
                chunk_logp = ch.value.tolist()
                send = rollouts[i].logprobs
                send_sum = float(sum(send[:n]))
                counted = n
                if n < len(send) and eos is not None:
                    token_chunk.append(len(chunk_logp))
                    chunk_logp.append(float(send[n]))
                    token_ids.append(eos)
                    send_sum += float(send[n])
                    counted += 1
                slots[i] = AlignedPeer(
                    token_ids=token_ids,
                    sender_logp_sum=send_sum,
                    sender_tokens=counted,
                    token_chunk=token_chunk if chunk_level else [],
                    chunk_sender_logp=chunk_logp if chunk_level else [],
                    multi_token_chunk_share=tr.residual.multi_token_chunk_share)
        return [s for s in slots if s is not None]


def _reward_stats(s: pb.RewardStats) -> RewardStats:
    """A REWARD_STATS record's sums as the pooling arithmetic holds them."""
    return RewardStats(int(s.count), float(s.sum), float(s.sum_sq))


_FINISH = {"stop": "FINISH_REASON_STOP", "length": "FINISH_REASON_LENGTH",
           "eos": "FINISH_REASON_EOS"}  # the engines' names -> experience.proto FinishReason
_VERIFIABLE = frozenset(pb.FinishReason.Name(f) for f in rules.VERIFIABLE_FINISH)


def round_records(
    run_id: str,
    policy: str,
    version: int,
    round_k: int,
    tokenizer_id: str,
    prompts: Sequence[Any],
    samples: Sequence[Sequence[Any]],
    rewards: Sequence[Sequence[float]],
    correct: Sequence[Sequence[bool]],
    tau: float,
    eos_token_id: int | None = None,
    success: Sequence[Sequence[float]] | None = None,
    renderings: Sequence[str | None] | None = None,
) -> list[Any]:
    """SEE records of one round: a ROLLOUT per sample, REWARD_STATS per prompt and a
    VERIFIED_SUCCESS per verified sample (its success reward >= tau, not truncated). A sample
    that stopped with `eos_token_id` as its last token finishes with EOS (receivers append their
    own). A verified sample that SEE could not take as a success (blank text, cut by its token
    budget) is published as a rollout only (cut: not verified). `success`: each sample's
    success reward (the task's `success_reward`), which a VERIFIED_SUCCESS record and the
    stats' `success_max` (SGT's gate) carry; default the rewards (the stats' `max` then
    gates). The stats' sums and `max` are over the rewards.
    `renderings`: the sender's own rendering of each prompt, for people (the dashboard's
    record view): receivers never read it, they render the problem their own way."""
    out: list[Any] = []
    gates = rewards if success is None else success
    for p_i, (prompt, row, rs, ok, gate) in enumerate(zip(prompts, samples, rewards, correct,
                                                          gates, strict=True)):
        common = dict(run_id=run_id, policy_id=policy, policy_version=version, round=round_k,
                      prompt_id=prompt.id, prompt_text=prompt.text, tokenizer_id=tokenizer_id,
                      meta={"skill": prompt.skill})
        # The sender's rendering rides on its rollouts only (for the dashboard's record view).
        rollout = {**common, "meta": {"skill": prompt.skill, **_rendering(renderings, p_i)}}
        for k, (s, r, good, g) in enumerate(zip(row, rs, ok, gate, strict=True)):
            reason = s.finish_reason
            if (reason == "stop" and eos_token_id is not None and s.token_ids
                    and s.token_ids[-1] == eos_token_id):
                reason = "eos"
            finish = _FINISH.get(reason, "FINISH_REASON_UNSPECIFIED")
            starts = [a for a, _ in s.offsets]
            ends = [b for _, b in s.offsets]
            out.append(ta.set_tokens(pb.ExperienceRecord(
                record_id=rollout_id(policy, round_k, p_i, k), kind=pb.ROLLOUT, text=s.text,
                reward=r, verified=good and finish != "FINISH_REASON_LENGTH",
                finish_reason=finish, **rollout),
                s.token_ids, starts, ends, s.logprobs))
            # SEE's rules of a success: verified, reaching tau, stopped (not cut), with text.
            if (good and g >= tau and finish in _VERIFIABLE and s.text.strip()):
                out.append(pb.ExperienceRecord(
                    record_id=success_id(policy, round_k, p_i, k), kind=pb.VERIFIED_SUCCESS,
                    text=s.text, reward=g, verified=True, finish_reason=finish, **common))
        stats = pb.RewardStats(count=len(rs), sum=float(sum(rs)),
                               sum_sq=float(sum(r * r for r in rs)), max=float(max(rs)),
                               success_max=None if success is None else float(max(gate)))
        out.append(pb.ExperienceRecord(record_id=stats_id(policy, round_k, p_i),
                                       kind=pb.REWARD_STATS, stats=stats, **common))
    return out


_META_CHARS = 1024  # SEE's default limit on one meta value (see.limits.max_meta_chars)


def _rendering(renderings: Sequence[str | None] | None, i: int) -> dict[str, str]:
    text = renderings[i] if renderings is not None else None
    if not text:
        return {}
    cut = _META_CHARS - 1
    return {"rendered_prompt": text if len(text) <= _META_CHARS else text[:cut] + "\u2026"}
