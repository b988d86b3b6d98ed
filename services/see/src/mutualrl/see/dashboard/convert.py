"""Records and THL answers turned into the dashboard's response models (pure: no I/O)."""

from __future__ import annotations

from pydantic import BaseModel

from mutualrl.common import token_arrays as ta
from mutualrl.see.dashboard.models import (
    ChunkOut,
    PairResidualOut,
    ReceiverOut,
    ResidualOut,
    TokenOut,
)
from mutualrl.v1 import alignment_pb2 as apb
from mutualrl.v1 import experience_pb2 as pb


def json_size(model: BaseModel) -> int:
    """Bytes of `model` as the answer's JSON."""
    return len(model.model_dump_json())


def has_tokens(rec: pb.ExperienceRecord) -> bool:
    """The record carries its own tokens with offsets (ROLLOUT records do)."""
    n = len(rec.token_ids_i32)
    return n > 0 and len(rec.offset_starts_i32) == n and len(rec.offset_ends_i32) == n


def record_tokens(rec: pb.ExperienceRecord) -> list[TokenOut]:
    """The sender's tokens as the record carries them, with their behaviour log-probs."""
    tok = ta.token_ids(rec).tolist()
    lps = ta.logprobs(rec).tolist() if len(rec.logprobs_f32) == len(rec.token_ids_i32) else None
    return [TokenOut(id=t, start=s, end=e, logprob=lps[i] if lps else None)
            for i, (t, s, e) in enumerate(zip(tok, ta.offset_starts(rec).tolist(),
                                              ta.offset_ends(rec).tolist(), strict=True))]


def tokenized_tokens(tt: apb.TokenizedText) -> list[TokenOut]:
    return [TokenOut(id=t, start=s, end=e, logprob=None)
            for t, s, e in zip(tt.token_ids, tt.offset_starts, tt.offset_ends, strict=True)]


def trace_item(rec: pb.ExperienceRecord, tokens: list[TokenOut]) -> apb.TraceItem:
    """What AlignTrace needs: the text, the sender's tokens with offsets and one value per
    token (log-probs; zeros when the record has none, then chunk sums are not reported)."""
    return apb.TraceItem(text=rec.text, source_token_ids=[t.id for t in tokens],
                         source_offset_starts=[t.start for t in tokens],
                         source_offset_ends=[t.end for t in tokens],
                         values=[t.logprob if t.logprob is not None else 0.0 for t in tokens])


def residual_out(r: apb.Residual) -> ResidualOut:
    return ResidualOut(roundtrip_mismatch_chars=r.roundtrip_mismatch_chars,
                       multi_token_chunk_share=r.multi_token_chunk_share,
                       uncovered_bytes=r.uncovered_bytes,
                       normalized_changed_chars=r.normalized_changed_chars)


def receiver_out(policy: str, tokenizer_id: str, tr: apb.AlignedTrace,
                 with_logprobs: bool) -> ReceiverOut:
    tokens = [TokenOut(id=t, start=s, end=e, logprob=None)
              for t, s, e in zip(tr.target_token_ids, tr.target_offset_starts,
                                 tr.target_offset_ends, strict=True)]
    chunks = [ChunkOut(char_start=c.char_start, char_end=c.char_end,
                       source_start=c.source_start, source_end=c.source_end,
                       target_start=c.target_start, target_end=c.target_end,
                       logprob_sum=c.value if with_logprobs else None, one_to_one=c.one_to_one)
              for c in tr.chunks]
    return ReceiverOut(policy_id=policy, tokenizer_id=tokenizer_id, tokens=tokens, chunks=chunks,
                       residual=residual_out(tr.residual), error=None)


def pair_residual(source: str, target: str, items: list[apb.TraceItem],
                  resp: apb.AlignTraceResponse) -> PairResidualOut:
    """Residual of a sample of one sender's records under one receiver's tokenizer (the
    batch residual THL computes, plus token and chunk counts)."""
    r = resp.residual
    return PairResidualOut(
        source_policy=source, target_policy=target, records=len(items),
        source_tokens=sum(len(it.source_token_ids) for it in items),
        target_tokens=sum(len(t.target_token_ids) for t in resp.results),
        chunks=sum(len(t.chunks) for t in resp.results),
        multi_token_chunk_share=r.multi_token_chunk_share,
        roundtrip_mismatch_chars=r.roundtrip_mismatch_chars, uncovered_bytes=r.uncovered_bytes,
        normalized_changed_chars=r.normalized_changed_chars, error=None)


def pair_error(source: str, target: str, error: str) -> PairResidualOut:
    return PairResidualOut(source_policy=source, target_policy=target, records=0,
                           source_tokens=0, target_tokens=0, chunks=0,
                           multi_token_chunk_share=0.0, roundtrip_mismatch_chars=0,
                           uncovered_bytes=0, normalized_changed_chars=0, error=error)
