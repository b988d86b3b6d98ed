"""Response models of the REST routes the dashboard reads (they appear in SEE's OpenAPI)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Out(BaseModel):
    """A response model whose fields' docstrings are their descriptions in the OpenAPI."""

    model_config = ConfigDict(use_attribute_docstrings=True)


class SessionOut(Out):
    auth_required: bool
    """SEE has a bearer token configured: every data route needs `Authorization: Bearer <token>`."""
    authenticated: bool
    """The request's Authorization header carries the right token (always true when no token is
    set)."""
    thl: bool
    """SEE can reach THL for receivers' token boundaries (see.thl_address is set)."""


class MetricRowOut(Out):
    cursor: str
    """Stream id of the row; pass as `after` to read later rows."""
    policy_id: str
    round: int
    unix_ms: int
    """When the trainer finished the round (Unix ms)."""
    values: dict[str, float]
    """Metric name -> value: reward_mean, pass_rate, rescued_prompts, rescued/<skill>,
    heldout/<skill>, prp_w_*, prp_w_loghist/<lower edge>, thl_multi_token_chunk_share, loss, step_s,
    ... (metrics.py of the trainer)."""


class MetricsOut(Out):
    run_id: str
    rows: list[MetricRowOut]
    """Rows in report order. A (policy, round) reported twice appears twice: the later wins."""
    cursor: str
    """Pass as `after` to poll for newer rows ("0-0" when the run has none yet)."""
    more: bool
    """The page was cut at `limit` or at the answer's byte budget: read again at once."""


class TransferOut(Out):
    taker_policy: str
    source_policy: str
    kind: str
    count: int


class TransferWindowOut(Out):
    run_id: str
    round_min: int | None
    """Window start (inclusive); null: the first round."""
    round_max: int | None
    """Window end (inclusive); null: the last round."""
    first_round: int | None
    """First round with any transfer (null if none)."""
    last_round: int | None
    """Last round with any transfer (null if none)."""
    transfers: list[TransferOut]
    matrix: dict[str, dict[str, dict[str, int]]]
    """kind -> taker -> source -> records taken. Without a window these are the run totals of
    GetRunStats; with one, the records of those rounds."""
    next_cursor: str | None
    """Pass as `cursor` for the next page of `transfers` (and `matrix`); null: the last."""


class TokenOut(Out):
    id: int
    """Token id in its tokenizer's vocabulary."""
    start: int
    """First character in the text (code points)."""
    end: int
    """One past the last character; start == end for tokens that cover no text of their own
    (special, or byte pieces)."""
    logprob: float | None
    """Sender's behaviour log-prob (nats); null on receiver sides and for records without them."""


class ChunkOut(Out):
    char_start: int
    char_end: int
    """Half-open character span; chunks tile the text."""
    source_start: int
    source_end: int
    """Half-open index range into the sender's tokens."""
    target_start: int
    target_end: int
    """Half-open index range into the receiver's tokens."""
    logprob_sum: float | None
    """Sum of the sender's log-probs over the chunk (THL's chunk value: mass is conserved); null
    when the record carries no log-probs."""
    one_to_one: bool
    """The chunk's tokens pair one to one."""


class ResidualOut(Out):
    roundtrip_mismatch_chars: int
    multi_token_chunk_share: float
    """Share of receiver tokens inside chunks that do not pair one to one."""
    uncovered_bytes: int
    normalized_changed_chars: int


class SenderOut(Out):
    policy_id: str
    tokenizer_id: str
    tokens: list[TokenOut]
    source: str
    """"record": the tokens the record carries; "thl": the record carries none, THL encoded the
    text."""
    error: str | None
    """Why there are no sender tokens, if so."""


class ReceiverOut(Out):
    policy_id: str
    tokenizer_id: str | None
    """The receiver's tokenizer (from its records); null while it has published nothing."""
    tokens: list[TokenOut]
    chunks: list[ChunkOut]
    residual: ResidualOut | None
    error: str | None
    """Why this receiver has no alignment, if so."""


class RenderingOut(Out):
    policy_id: str
    record_id: str | None
    """The policy's ROLLOUT record on the same prompt whose round is nearest the shown record's;
    null while it has none (in the scanned window)."""
    round: int | None
    """That record's round."""
    rendered_prompt: str | None
    """The policy's own rendering of the prompt (its chat template), from that record; null when it
    renders plain text or has no such record."""


class AlignmentOut(Out):
    run_id: str
    record_id: str
    kind: str
    round: int
    prompt_id: str
    prompt_text: str
    rendered_prompt: str | None = None
    """The sender's own rendering of the prompt (its chat template), when it had one; receivers
    render the problem their own way (`peer_renderings`)."""
    text: str
    reward: float
    sender: SenderOut
    receivers: list[ReceiverOut]
    """Every other policy of the run."""
    peer_renderings: list[RenderingOut] = Field(default_factory=list)
    """Every other policy's own rendering of the same prompt, read from its ROLLOUT records (the
    problem crosses, not the sender's rendering)."""


class PairResidualOut(Out):
    source_policy: str
    target_policy: str
    records: int
    """Sender ROLLOUT records aligned (the latest in the window)."""
    source_tokens: int
    target_tokens: int
    chunks: int
    multi_token_chunk_share: float
    """Share of all receiver tokens of the sample inside multi-token chunks."""
    roundtrip_mismatch_chars: int
    uncovered_bytes: int
    normalized_changed_chars: int
    error: str | None
    """Why the pair could not be measured, if so."""


class ResidualMatrixOut(Out):
    run_id: str
    sample: int
    """Records per sender asked for."""
    round_min: int | None
    round_max: int | None
    pairs: list[PairResidualOut]
