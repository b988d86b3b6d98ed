from mutualrl.v1 import runs_pb2 as _runs_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class AlignMode(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    ALIGN_MODE_UNSPECIFIED: _ClassVar[AlignMode]
    ALIGN_MODE_CHUNK: _ClassVar[AlignMode]
    ALIGN_MODE_SEQUENCE: _ClassVar[AlignMode]

class Placement(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PLACEMENT_UNSPECIFIED: _ClassVar[Placement]
    PLACEMENT_LAST: _ClassVar[Placement]
    PLACEMENT_SPREAD: _ClassVar[Placement]
ALIGN_MODE_UNSPECIFIED: AlignMode
ALIGN_MODE_CHUNK: AlignMode
ALIGN_MODE_SEQUENCE: AlignMode
PLACEMENT_UNSPECIFIED: Placement
PLACEMENT_LAST: Placement
PLACEMENT_SPREAD: Placement

class RegisterTokenizerRequest(_message.Message):
    __slots__ = ("tokenizer_id", "path", "overwrite", "run_id")
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    OVERWRITE_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    tokenizer_id: str
    path: str
    overwrite: bool
    run_id: str
    def __init__(self, tokenizer_id: _Optional[str] = ..., path: _Optional[str] = ..., overwrite: _Optional[bool] = ..., run_id: _Optional[str] = ...) -> None: ...

class TokenizerInfo(_message.Message):
    __slots__ = ("tokenizer_id", "path", "model_type", "vocab_size", "byte_level", "normalizer")
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    PATH_FIELD_NUMBER: _ClassVar[int]
    MODEL_TYPE_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    BYTE_LEVEL_FIELD_NUMBER: _ClassVar[int]
    NORMALIZER_FIELD_NUMBER: _ClassVar[int]
    tokenizer_id: str
    path: str
    model_type: str
    vocab_size: int
    byte_level: bool
    normalizer: str
    def __init__(self, tokenizer_id: _Optional[str] = ..., path: _Optional[str] = ..., model_type: _Optional[str] = ..., vocab_size: _Optional[int] = ..., byte_level: _Optional[bool] = ..., normalizer: _Optional[str] = ...) -> None: ...

class ListTokenizersRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ListTokenizersResponse(_message.Message):
    __slots__ = ("tokenizers",)
    TOKENIZERS_FIELD_NUMBER: _ClassVar[int]
    tokenizers: _containers.RepeatedCompositeFieldContainer[TokenizerInfo]
    def __init__(self, tokenizers: _Optional[_Iterable[_Union[TokenizerInfo, _Mapping]]] = ...) -> None: ...

class RetokenizeRequest(_message.Message):
    __slots__ = ("tokenizer_id", "texts", "add_special_tokens", "apply_chat_template")
    TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    TEXTS_FIELD_NUMBER: _ClassVar[int]
    ADD_SPECIAL_TOKENS_FIELD_NUMBER: _ClassVar[int]
    APPLY_CHAT_TEMPLATE_FIELD_NUMBER: _ClassVar[int]
    tokenizer_id: str
    texts: _containers.RepeatedScalarFieldContainer[str]
    add_special_tokens: bool
    apply_chat_template: bool
    def __init__(self, tokenizer_id: _Optional[str] = ..., texts: _Optional[_Iterable[str]] = ..., add_special_tokens: _Optional[bool] = ..., apply_chat_template: _Optional[bool] = ...) -> None: ...

class Residual(_message.Message):
    __slots__ = ("roundtrip_mismatch_chars", "multi_token_chunk_share", "uncovered_bytes", "normalized_changed_chars")
    ROUNDTRIP_MISMATCH_CHARS_FIELD_NUMBER: _ClassVar[int]
    MULTI_TOKEN_CHUNK_SHARE_FIELD_NUMBER: _ClassVar[int]
    UNCOVERED_BYTES_FIELD_NUMBER: _ClassVar[int]
    NORMALIZED_CHANGED_CHARS_FIELD_NUMBER: _ClassVar[int]
    roundtrip_mismatch_chars: int
    multi_token_chunk_share: float
    uncovered_bytes: int
    normalized_changed_chars: int
    def __init__(self, roundtrip_mismatch_chars: _Optional[int] = ..., multi_token_chunk_share: _Optional[float] = ..., uncovered_bytes: _Optional[int] = ..., normalized_changed_chars: _Optional[int] = ...) -> None: ...

class TokenizedText(_message.Message):
    __slots__ = ("token_ids", "offset_starts", "offset_ends", "text", "residual")
    TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_STARTS_FIELD_NUMBER: _ClassVar[int]
    OFFSET_ENDS_FIELD_NUMBER: _ClassVar[int]
    TEXT_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_FIELD_NUMBER: _ClassVar[int]
    token_ids: _containers.RepeatedScalarFieldContainer[int]
    offset_starts: _containers.RepeatedScalarFieldContainer[int]
    offset_ends: _containers.RepeatedScalarFieldContainer[int]
    text: str
    residual: Residual
    def __init__(self, token_ids: _Optional[_Iterable[int]] = ..., offset_starts: _Optional[_Iterable[int]] = ..., offset_ends: _Optional[_Iterable[int]] = ..., text: _Optional[str] = ..., residual: _Optional[_Union[Residual, _Mapping]] = ...) -> None: ...

class RetokenizeResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[TokenizedText]
    def __init__(self, results: _Optional[_Iterable[_Union[TokenizedText, _Mapping]]] = ...) -> None: ...

class TraceItem(_message.Message):
    __slots__ = ("text", "source_token_ids", "source_offset_starts", "source_offset_ends", "values")
    TEXT_FIELD_NUMBER: _ClassVar[int]
    SOURCE_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_STARTS_FIELD_NUMBER: _ClassVar[int]
    SOURCE_OFFSET_ENDS_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    text: str
    source_token_ids: _containers.RepeatedScalarFieldContainer[int]
    source_offset_starts: _containers.RepeatedScalarFieldContainer[int]
    source_offset_ends: _containers.RepeatedScalarFieldContainer[int]
    values: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, text: _Optional[str] = ..., source_token_ids: _Optional[_Iterable[int]] = ..., source_offset_starts: _Optional[_Iterable[int]] = ..., source_offset_ends: _Optional[_Iterable[int]] = ..., values: _Optional[_Iterable[float]] = ...) -> None: ...

class AlignTraceRequest(_message.Message):
    __slots__ = ("source_tokenizer_id", "target_tokenizer_id", "items", "mode", "placement")
    SOURCE_TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    TARGET_TOKENIZER_ID_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    MODE_FIELD_NUMBER: _ClassVar[int]
    PLACEMENT_FIELD_NUMBER: _ClassVar[int]
    source_tokenizer_id: str
    target_tokenizer_id: str
    items: _containers.RepeatedCompositeFieldContainer[TraceItem]
    mode: AlignMode
    placement: Placement
    def __init__(self, source_tokenizer_id: _Optional[str] = ..., target_tokenizer_id: _Optional[str] = ..., items: _Optional[_Iterable[_Union[TraceItem, _Mapping]]] = ..., mode: _Optional[_Union[AlignMode, str]] = ..., placement: _Optional[_Union[Placement, str]] = ...) -> None: ...

class Chunk(_message.Message):
    __slots__ = ("char_start", "char_end", "source_start", "source_end", "target_start", "target_end", "value", "one_to_one")
    CHAR_START_FIELD_NUMBER: _ClassVar[int]
    CHAR_END_FIELD_NUMBER: _ClassVar[int]
    SOURCE_START_FIELD_NUMBER: _ClassVar[int]
    SOURCE_END_FIELD_NUMBER: _ClassVar[int]
    TARGET_START_FIELD_NUMBER: _ClassVar[int]
    TARGET_END_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    ONE_TO_ONE_FIELD_NUMBER: _ClassVar[int]
    char_start: int
    char_end: int
    source_start: int
    source_end: int
    target_start: int
    target_end: int
    value: float
    one_to_one: bool
    def __init__(self, char_start: _Optional[int] = ..., char_end: _Optional[int] = ..., source_start: _Optional[int] = ..., source_end: _Optional[int] = ..., target_start: _Optional[int] = ..., target_end: _Optional[int] = ..., value: _Optional[float] = ..., one_to_one: _Optional[bool] = ...) -> None: ...

class AlignedTrace(_message.Message):
    __slots__ = ("target_token_ids", "target_offset_starts", "target_offset_ends", "target_values", "chunks", "sequence_value", "residual", "mass_error")
    TARGET_TOKEN_IDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_OFFSET_STARTS_FIELD_NUMBER: _ClassVar[int]
    TARGET_OFFSET_ENDS_FIELD_NUMBER: _ClassVar[int]
    TARGET_VALUES_FIELD_NUMBER: _ClassVar[int]
    CHUNKS_FIELD_NUMBER: _ClassVar[int]
    SEQUENCE_VALUE_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_FIELD_NUMBER: _ClassVar[int]
    MASS_ERROR_FIELD_NUMBER: _ClassVar[int]
    target_token_ids: _containers.RepeatedScalarFieldContainer[int]
    target_offset_starts: _containers.RepeatedScalarFieldContainer[int]
    target_offset_ends: _containers.RepeatedScalarFieldContainer[int]
    target_values: _containers.RepeatedScalarFieldContainer[float]
    chunks: _containers.RepeatedCompositeFieldContainer[Chunk]
    sequence_value: float
    residual: Residual
    mass_error: float
    def __init__(self, target_token_ids: _Optional[_Iterable[int]] = ..., target_offset_starts: _Optional[_Iterable[int]] = ..., target_offset_ends: _Optional[_Iterable[int]] = ..., target_values: _Optional[_Iterable[float]] = ..., chunks: _Optional[_Iterable[_Union[Chunk, _Mapping]]] = ..., sequence_value: _Optional[float] = ..., residual: _Optional[_Union[Residual, _Mapping]] = ..., mass_error: _Optional[float] = ...) -> None: ...

class AlignTraceResponse(_message.Message):
    __slots__ = ("results", "residual")
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    RESIDUAL_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[AlignedTrace]
    residual: Residual
    def __init__(self, results: _Optional[_Iterable[_Union[AlignedTrace, _Mapping]]] = ..., residual: _Optional[_Union[Residual, _Mapping]] = ...) -> None: ...
