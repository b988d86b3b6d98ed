from mutualrl.v1 import runs_pb2 as _runs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class RecordKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RECORD_KIND_UNSPECIFIED: _ClassVar[RecordKind]
    ROLLOUT: _ClassVar[RecordKind]
    REWARD_STATS: _ClassVar[RecordKind]
    VERIFIED_SUCCESS: _ClassVar[RecordKind]

class FinishReason(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    FINISH_REASON_UNSPECIFIED: _ClassVar[FinishReason]
    FINISH_REASON_STOP: _ClassVar[FinishReason]
    FINISH_REASON_LENGTH: _ClassVar[FinishReason]
    FINISH_REASON_EOS: _ClassVar[FinishReason]

class PublishStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PUBLISH_STATUS_UNSPECIFIED: _ClassVar[PublishStatus]
    PUBLISH_STATUS_STORED: _ClassVar[PublishStatus]
    PUBLISH_STATUS_DUPLICATE: _ClassVar[PublishStatus]
RECORD_KIND_UNSPECIFIED: RecordKind
ROLLOUT: RecordKind
REWARD_STATS: RecordKind
VERIFIED_SUCCESS: RecordKind
FINISH_REASON_UNSPECIFIED: FinishReason
FINISH_REASON_STOP: FinishReason
FINISH_REASON_LENGTH: FinishReason
FINISH_REASON_EOS: FinishReason
PUBLISH_STATUS_UNSPECIFIED: PublishStatus
PUBLISH_STATUS_STORED: PublishStatus
PUBLISH_STATUS_DUPLICATE: PublishStatus

class RewardStats(_message.Message):
    __slots__ = ("count", "sum", "sum_sq", "max", "success_max")
    COUNT_FIELD_NUMBER: _ClassVar[int]
    SUM_FIELD_NUMBER: _ClassVar[int]
    SUM_SQ_FIELD_NUMBER: _ClassVar[int]
    MAX_FIELD_NUMBER: _ClassVar[int]
    SUCCESS_MAX_FIELD_NUMBER: _ClassVar[int]
    count: int
    sum: float
    sum_sq: float
    max: float
    success_max: float
    def __init__(self, count: _Optional[int] = ..., sum: _Optional[float] = ..., sum_sq: _Optional[float] = ..., max: _Optional[float] = ..., success_max: _Optional[float] = ...) -> None: ...

class ExperienceRecord(_message.Message):
    __slots__ = ("record_id", "run_id", "policy_id", "policy_version", "round", "prompt_id", "kind", "prompt_text", "text", "tokenizer_id", "token_ids_i32", "offset_starts_i32", "offset_ends_i32", "logprobs_f32", "reward", "verified", "finish_reason", "stats", "created_unix_ms", "meta")
    class MetaEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_TEXT_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    TOKEN_IDS_I32_FIELD_NUMBER: _ClassVar[int]
    OFFSET_STARTS_I32_FIELD_NUMBER: _ClassVar[int]
    OFFSET_ENDS_I32_FIELD_NUMBER: _ClassVar[int]
    LOGPROBS_F32_FIELD_NUMBER: _ClassVar[int]
    REWARD_FIELD_NUMBER: _ClassVar[int]
    VERIFIED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    META_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    run_id: str
    policy_id: str
    policy_version: int
    round: int
    prompt_id: str
    kind: RecordKind
    prompt_text: str
    text: str
    tokenizer_id: str
    token_ids_i32: bytes
    offset_starts_i32: bytes
    offset_ends_i32: bytes
    logprobs_f32: bytes
    reward: float
    verified: bool
    finish_reason: FinishReason
    stats: RewardStats
    created_unix_ms: int
    meta: _containers.ScalarMap[str, str]
    def __init__(self, record_id: _Optional[str] = ..., run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., policy_version: _Optional[int] = ..., round: _Optional[int] = ..., prompt_id: _Optional[str] = ..., kind: _Optional[_Union[RecordKind, str]] = ..., prompt_text: _Optional[str] = ..., text: _Optional[str] = ..., tokenizer_id: _Optional[str] = ..., token_ids_i32: _Optional[bytes] = ..., offset_starts_i32: _Optional[bytes] = ..., offset_ends_i32: _Optional[bytes] = ..., logprobs_f32: _Optional[bytes] = ..., reward: _Optional[float] = ..., verified: _Optional[bool] = ..., finish_reason: _Optional[_Union[FinishReason, str]] = ..., stats: _Optional[_Union[RewardStats, _Mapping]] = ..., created_unix_ms: _Optional[int] = ..., meta: _Optional[_Mapping[str, str]] = ...) -> None: ...

class Retention(_message.Message):
    __slots__ = ("max_stream_len", "ttl_seconds", "max_rounds")
    MAX_STREAM_LEN_FIELD_NUMBER: _ClassVar[int]
    TTL_SECONDS_FIELD_NUMBER: _ClassVar[int]
    MAX_ROUNDS_FIELD_NUMBER: _ClassVar[int]
    max_stream_len: int
    ttl_seconds: int
    max_rounds: int
    def __init__(self, max_stream_len: _Optional[int] = ..., ttl_seconds: _Optional[int] = ..., max_rounds: _Optional[int] = ...) -> None: ...

class RunConfig(_message.Message):
    __slots__ = ("run_id", "policies", "tau", "retention")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    TAU_FIELD_NUMBER: _ClassVar[int]
    RETENTION_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policies: _containers.RepeatedScalarFieldContainer[str]
    tau: float
    retention: Retention
    def __init__(self, run_id: _Optional[str] = ..., policies: _Optional[_Iterable[str]] = ..., tau: _Optional[float] = ..., retention: _Optional[_Union[Retention, _Mapping]] = ...) -> None: ...

class Run(_message.Message):
    __slots__ = ("config", "created_unix_ms")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    CREATED_UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    config: RunConfig
    created_unix_ms: int
    def __init__(self, config: _Optional[_Union[RunConfig, _Mapping]] = ..., created_unix_ms: _Optional[int] = ...) -> None: ...

class CreateRunRequest(_message.Message):
    __slots__ = ("config", "exist_ok")
    CONFIG_FIELD_NUMBER: _ClassVar[int]
    EXIST_OK_FIELD_NUMBER: _ClassVar[int]
    config: RunConfig
    exist_ok: bool
    def __init__(self, config: _Optional[_Union[RunConfig, _Mapping]] = ..., exist_ok: _Optional[bool] = ...) -> None: ...

class GetRunRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class ListRunsRequest(_message.Message):
    __slots__ = ("page_size", "page_token")
    PAGE_SIZE_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    page_size: int
    page_token: str
    def __init__(self, page_size: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class ListRunsResponse(_message.Message):
    __slots__ = ("runs", "next_page_token")
    RUNS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    runs: _containers.RepeatedCompositeFieldContainer[Run]
    next_page_token: str
    def __init__(self, runs: _Optional[_Iterable[_Union[Run, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class PublishRequest(_message.Message):
    __slots__ = ("run_id", "records")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    RECORDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    records: _containers.RepeatedCompositeFieldContainer[ExperienceRecord]
    def __init__(self, run_id: _Optional[str] = ..., records: _Optional[_Iterable[_Union[ExperienceRecord, _Mapping]]] = ...) -> None: ...

class PublishResult(_message.Message):
    __slots__ = ("record_id", "status")
    RECORD_ID_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    record_id: str
    status: PublishStatus
    def __init__(self, record_id: _Optional[str] = ..., status: _Optional[_Union[PublishStatus, str]] = ...) -> None: ...

class PublishResponse(_message.Message):
    __slots__ = ("results", "stored", "duplicates")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    STORED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[PublishResult]
    stored: int
    duplicates: int
    def __init__(self, results: _Optional[_Iterable[_Union[PublishResult, _Mapping]]] = ..., stored: _Optional[int] = ..., duplicates: _Optional[int] = ...) -> None: ...

class FetchRolloutsRequest(_message.Message):
    __slots__ = ("run_id", "policy_id", "consumer", "max_records", "block_ms", "current_round", "max_round_lag", "min_policy_version", "claim_idle_ms")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    CONSUMER_FIELD_NUMBER: _ClassVar[int]
    MAX_RECORDS_FIELD_NUMBER: _ClassVar[int]
    BLOCK_MS_FIELD_NUMBER: _ClassVar[int]
    CURRENT_ROUND_FIELD_NUMBER: _ClassVar[int]
    MAX_ROUND_LAG_FIELD_NUMBER: _ClassVar[int]
    MIN_POLICY_VERSION_FIELD_NUMBER: _ClassVar[int]
    CLAIM_IDLE_MS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    consumer: str
    max_records: int
    block_ms: int
    current_round: int
    max_round_lag: int
    min_policy_version: int
    claim_idle_ms: int
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., consumer: _Optional[str] = ..., max_records: _Optional[int] = ..., block_ms: _Optional[int] = ..., current_round: _Optional[int] = ..., max_round_lag: _Optional[int] = ..., min_policy_version: _Optional[int] = ..., claim_idle_ms: _Optional[int] = ...) -> None: ...

class Delivery(_message.Message):
    __slots__ = ("delivery_id", "record", "delivery_count")
    DELIVERY_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_COUNT_FIELD_NUMBER: _ClassVar[int]
    delivery_id: str
    record: ExperienceRecord
    delivery_count: int
    def __init__(self, delivery_id: _Optional[str] = ..., record: _Optional[_Union[ExperienceRecord, _Mapping]] = ..., delivery_count: _Optional[int] = ...) -> None: ...

class FetchRolloutsResponse(_message.Message):
    __slots__ = ("deliveries", "skipped_stale", "more")
    DELIVERIES_FIELD_NUMBER: _ClassVar[int]
    SKIPPED_STALE_FIELD_NUMBER: _ClassVar[int]
    MORE_FIELD_NUMBER: _ClassVar[int]
    deliveries: _containers.RepeatedCompositeFieldContainer[Delivery]
    skipped_stale: int
    more: bool
    def __init__(self, deliveries: _Optional[_Iterable[_Union[Delivery, _Mapping]]] = ..., skipped_stale: _Optional[int] = ..., more: _Optional[bool] = ...) -> None: ...

class AckRequest(_message.Message):
    __slots__ = ("run_id", "policy_id", "delivery_ids")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    DELIVERY_IDS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    delivery_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., delivery_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class AckResponse(_message.Message):
    __slots__ = ("acked",)
    ACKED_FIELD_NUMBER: _ClassVar[int]
    acked: int
    def __init__(self, acked: _Optional[int] = ...) -> None: ...

class RoundStatsRequest(_message.Message):
    __slots__ = ("run_id", "round", "prompt_ids", "policy_id", "expect_policies", "wait_ms", "page_token", "wait_only")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    EXPECT_POLICIES_FIELD_NUMBER: _ClassVar[int]
    WAIT_MS_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    WAIT_ONLY_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    round: int
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    policy_id: str
    expect_policies: _containers.RepeatedScalarFieldContainer[str]
    wait_ms: int
    page_token: str
    wait_only: bool
    def __init__(self, run_id: _Optional[str] = ..., round: _Optional[int] = ..., prompt_ids: _Optional[_Iterable[str]] = ..., policy_id: _Optional[str] = ..., expect_policies: _Optional[_Iterable[str]] = ..., wait_ms: _Optional[int] = ..., page_token: _Optional[str] = ..., wait_only: _Optional[bool] = ...) -> None: ...

class PolicyStats(_message.Message):
    __slots__ = ("policy_id", "stats")
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    STATS_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    stats: RewardStats
    def __init__(self, policy_id: _Optional[str] = ..., stats: _Optional[_Union[RewardStats, _Mapping]] = ...) -> None: ...

class PromptStats(_message.Message):
    __slots__ = ("prompt_id", "policies", "pooled")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    POOLED_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    policies: _containers.RepeatedCompositeFieldContainer[PolicyStats]
    pooled: RewardStats
    def __init__(self, prompt_id: _Optional[str] = ..., policies: _Optional[_Iterable[_Union[PolicyStats, _Mapping]]] = ..., pooled: _Optional[_Union[RewardStats, _Mapping]] = ...) -> None: ...

class RoundStatsResponse(_message.Message):
    __slots__ = ("prompts", "complete", "missing_policies", "next_page_token")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    COMPLETE_FIELD_NUMBER: _ClassVar[int]
    MISSING_POLICIES_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[PromptStats]
    complete: bool
    missing_policies: _containers.RepeatedScalarFieldContainer[str]
    next_page_token: str
    def __init__(self, prompts: _Optional[_Iterable[_Union[PromptStats, _Mapping]]] = ..., complete: _Optional[bool] = ..., missing_policies: _Optional[_Iterable[str]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SuccessesRequest(_message.Message):
    __slots__ = ("run_id", "policy_id", "prompt_ids", "max_per_prompt", "min_round", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    PROMPT_IDS_FIELD_NUMBER: _ClassVar[int]
    MAX_PER_PROMPT_FIELD_NUMBER: _ClassVar[int]
    MIN_ROUND_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policy_id: str
    prompt_ids: _containers.RepeatedScalarFieldContainer[str]
    max_per_prompt: int
    min_round: int
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., policy_id: _Optional[str] = ..., prompt_ids: _Optional[_Iterable[str]] = ..., max_per_prompt: _Optional[int] = ..., min_round: _Optional[int] = ..., page_token: _Optional[str] = ...) -> None: ...

class PromptSuccesses(_message.Message):
    __slots__ = ("prompt_id", "successes")
    PROMPT_ID_FIELD_NUMBER: _ClassVar[int]
    SUCCESSES_FIELD_NUMBER: _ClassVar[int]
    prompt_id: str
    successes: _containers.RepeatedCompositeFieldContainer[ExperienceRecord]
    def __init__(self, prompt_id: _Optional[str] = ..., successes: _Optional[_Iterable[_Union[ExperienceRecord, _Mapping]]] = ...) -> None: ...

class SuccessesResponse(_message.Message):
    __slots__ = ("prompts", "next_page_token")
    PROMPTS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    prompts: _containers.RepeatedCompositeFieldContainer[PromptSuccesses]
    next_page_token: str
    def __init__(self, prompts: _Optional[_Iterable[_Union[PromptSuccesses, _Mapping]]] = ..., next_page_token: _Optional[str] = ...) -> None: ...

class SubscribeRequest(_message.Message):
    __slots__ = ("run_id", "kinds", "after_id")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    KINDS_FIELD_NUMBER: _ClassVar[int]
    AFTER_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    kinds: _containers.RepeatedScalarFieldContainer[RecordKind]
    after_id: str
    def __init__(self, run_id: _Optional[str] = ..., kinds: _Optional[_Iterable[_Union[RecordKind, str]]] = ..., after_id: _Optional[str] = ...) -> None: ...

class ExperienceEvent(_message.Message):
    __slots__ = ("event_id", "record")
    EVENT_ID_FIELD_NUMBER: _ClassVar[int]
    RECORD_FIELD_NUMBER: _ClassVar[int]
    event_id: str
    record: ExperienceRecord
    def __init__(self, event_id: _Optional[str] = ..., record: _Optional[_Union[ExperienceRecord, _Mapping]] = ...) -> None: ...

class RunStatsRequest(_message.Message):
    __slots__ = ("run_id", "page_token")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    page_token: str
    def __init__(self, run_id: _Optional[str] = ..., page_token: _Optional[str] = ...) -> None: ...

class PolicyCounts(_message.Message):
    __slots__ = ("policy_id", "published")
    class PublishedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    PUBLISHED_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    published: _containers.ScalarMap[str, int]
    def __init__(self, policy_id: _Optional[str] = ..., published: _Optional[_Mapping[str, int]] = ...) -> None: ...

class TransferCount(_message.Message):
    __slots__ = ("taker_policy", "source_policy", "kind", "count")
    TAKER_POLICY_FIELD_NUMBER: _ClassVar[int]
    SOURCE_POLICY_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    taker_policy: str
    source_policy: str
    kind: RecordKind
    count: int
    def __init__(self, taker_policy: _Optional[str] = ..., source_policy: _Optional[str] = ..., kind: _Optional[_Union[RecordKind, str]] = ..., count: _Optional[int] = ...) -> None: ...

class RunStats(_message.Message):
    __slots__ = ("run_id", "policies", "transfers", "trimmed", "duplicates", "stream_lengths", "next_page_token")
    class TrimmedEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    class StreamLengthsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: int
        def __init__(self, key: _Optional[str] = ..., value: _Optional[int] = ...) -> None: ...
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    POLICIES_FIELD_NUMBER: _ClassVar[int]
    TRANSFERS_FIELD_NUMBER: _ClassVar[int]
    TRIMMED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATES_FIELD_NUMBER: _ClassVar[int]
    STREAM_LENGTHS_FIELD_NUMBER: _ClassVar[int]
    NEXT_PAGE_TOKEN_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    policies: _containers.RepeatedCompositeFieldContainer[PolicyCounts]
    transfers: _containers.RepeatedCompositeFieldContainer[TransferCount]
    trimmed: _containers.ScalarMap[str, int]
    duplicates: int
    stream_lengths: _containers.ScalarMap[str, int]
    next_page_token: str
    def __init__(self, run_id: _Optional[str] = ..., policies: _Optional[_Iterable[_Union[PolicyCounts, _Mapping]]] = ..., transfers: _Optional[_Iterable[_Union[TransferCount, _Mapping]]] = ..., trimmed: _Optional[_Mapping[str, int]] = ..., duplicates: _Optional[int] = ..., stream_lengths: _Optional[_Mapping[str, int]] = ..., next_page_token: _Optional[str] = ...) -> None: ...
