"""Response models of the REST routes the dashboard reads (they appear in SEE's OpenAPI)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class SessionOut(BaseModel):
    auth_required: bool = Field(description="SEE has a bearer token configured: every data "
                                            "route needs `Authorization: Bearer <token>`.")
    authenticated: bool = Field(description="The request's Authorization header carries the "
                                            "right token (always true when no token is set).")
    thl: bool = Field(description="SEE can reach THL for receivers' token boundaries "
                                  "(see.thl_address is set).")


class MetricRowOut(BaseModel):
    cursor: str = Field(description="Stream id of the row; pass as `after` to read later rows.")
    policy_id: str
    round: int
    unix_ms: int = Field(description="When the trainer finished the round (Unix ms).")
    values: dict[str, float] = Field(
        description="Metric name -> value: reward_mean, pass_rate, rescued_prompts, "
                    "rescued/<skill>, heldout/<skill>, prp_w_*, prp_w_loghist/<lower edge>, "
                    "thl_multi_token_chunk_share, loss, step_s, ... (metrics.py of the trainer).")


class MetricsOut(BaseModel):
    run_id: str
    rows: list[MetricRowOut] = Field(description="Rows in report order. A (policy, round) "
                                                 "reported twice appears twice: the later wins.")
    cursor: str = Field(description="Pass as `after` to poll for newer rows (\"0-0\" when the "
                                    "run has none yet).")
    more: bool = Field(description="The page was cut at `limit` or at the answer's byte "
                                   "budget: read again at once.")


class TransferOut(BaseModel):
    taker_policy: str
    source_policy: str
    kind: str
    count: int


class TransferWindowOut(BaseModel):
    run_id: str
    round_min: int | None = Field(description="Window start (inclusive); null: the first round.")
    round_max: int | None = Field(description="Window end (inclusive); null: the last round.")
    first_round: int | None = Field(description="First round with any transfer (null if none).")
    last_round: int | None = Field(description="Last round with any transfer (null if none).")
    transfers: list[TransferOut]
    matrix: dict[str, dict[str, dict[str, int]]] = Field(
        description="kind -> taker -> source -> records taken. Without a window these are the "
                    "run totals of GetRunStats; with one, the records of those rounds.")
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page of "
                                                "`transfers` (and `matrix`); null: the last.")


class TokenOut(BaseModel):
    id: int = Field(description="Token id in its tokenizer's vocabulary.")
    start: int = Field(description="First character in the text (code points).")
    end: int = Field(description="One past the last character; start == end for tokens that "
                                 "cover no text of their own (special, or byte pieces).")
    logprob: float | None = Field(description="Sender's behaviour log-prob (nats); null on "
                                              "receiver sides and for records without them.")


class ChunkOut(BaseModel):
    char_start: int
    char_end: int = Field(description="Half-open character span; chunks tile the text.")
    source_start: int
    source_end: int = Field(description="Half-open index range into the sender's tokens.")
    target_start: int
    target_end: int = Field(description="Half-open index range into the receiver's tokens.")
    logprob_sum: float | None = Field(
        description="Sum of the sender's log-probs over the chunk (THL's chunk value: mass "
                    "is conserved); null when the record carries no log-probs.")
    one_to_one: bool = Field(description="The chunk's tokens pair one to one.")


class ResidualOut(BaseModel):
    roundtrip_mismatch_chars: int
    multi_token_chunk_share: float = Field(description="Share of receiver tokens inside "
                                                       "chunks that do not pair one to one.")
    uncovered_bytes: int
    normalized_changed_chars: int


class SenderOut(BaseModel):
    policy_id: str
    tokenizer_id: str
    tokens: list[TokenOut]
    source: str = Field(description="\"record\": the tokens the record carries; \"thl\": the "
                                    "record carries none, THL encoded the text.")
    error: str | None = Field(description="Why there are no sender tokens, if so.")


class ReceiverOut(BaseModel):
    policy_id: str
    tokenizer_id: str | None = Field(description="The receiver's tokenizer (from its records); "
                                                 "null while it has published nothing.")
    tokens: list[TokenOut]
    chunks: list[ChunkOut]
    residual: ResidualOut | None
    error: str | None = Field(description="Why this receiver has no alignment, if so.")


class RenderingOut(BaseModel):
    policy_id: str
    record_id: str | None = Field(description="The policy's ROLLOUT record on the same prompt "
                                              "whose round is nearest the shown record's; null "
                                              "while it has none (in the scanned window).")
    round: int | None = Field(description="That record's round.")
    rendered_prompt: str | None = Field(
        description="The policy's own rendering of the prompt (its chat template), from that "
                    "record; null when it renders plain text or has no such record.")


class AlignmentOut(BaseModel):
    run_id: str
    record_id: str
    kind: str
    round: int
    prompt_id: str
    prompt_text: str
    rendered_prompt: str | None = Field(
        None, description="The sender's own rendering of the prompt (its chat template), when "
        "it had one; receivers render the problem their own way (`peer_renderings`).")
    text: str
    reward: float
    sender: SenderOut
    receivers: list[ReceiverOut] = Field(description="Every other policy of the run.")
    peer_renderings: list[RenderingOut] = Field(
        default_factory=list, description="Every other policy's own rendering of the same "
        "prompt, read from its ROLLOUT records (the problem crosses, not the sender's rendering).")


class PairResidualOut(BaseModel):
    source_policy: str
    target_policy: str
    records: int = Field(description="Sender ROLLOUT records aligned (the latest in the window).")
    source_tokens: int
    target_tokens: int
    chunks: int
    multi_token_chunk_share: float = Field(description="Share of all receiver tokens of the "
                                                       "sample inside multi-token chunks.")
    roundtrip_mismatch_chars: int
    uncovered_bytes: int
    normalized_changed_chars: int
    error: str | None = Field(description="Why the pair could not be measured, if so.")


class ResidualMatrixOut(BaseModel):
    run_id: str
    sample: int = Field(description="Records per sender asked for.")
    round_min: int | None
    round_max: int | None
    pairs: list[PairResidualOut]
