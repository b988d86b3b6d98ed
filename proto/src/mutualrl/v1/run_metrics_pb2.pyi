from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class MetricRow(_message.Message):
    __slots__ = ("policy_id", "round", "values", "unix_ms")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    POLICY_ID_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    UNIX_MS_FIELD_NUMBER: _ClassVar[int]
    policy_id: str
    round: int
    values: _containers.ScalarMap[str, float]
    unix_ms: int
    def __init__(self, policy_id: _Optional[str] = ..., round: _Optional[int] = ..., values: _Optional[_Mapping[str, float]] = ..., unix_ms: _Optional[int] = ...) -> None: ...

class ReportMetricsRequest(_message.Message):
    __slots__ = ("run_id", "rows")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    ROWS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    rows: _containers.RepeatedCompositeFieldContainer[MetricRow]
    def __init__(self, run_id: _Optional[str] = ..., rows: _Optional[_Iterable[_Union[MetricRow, _Mapping]]] = ...) -> None: ...

class ReportMetricsResponse(_message.Message):
    __slots__ = ("stored",)
    STORED_FIELD_NUMBER: _ClassVar[int]
    stored: int
    def __init__(self, stored: _Optional[int] = ...) -> None: ...
