"""Request bodies that do not parse become INVALID_ARGUMENT, on every RPC of every service.

A method's request deserializer runs on bytes a client chose (random bytes, a `string` field
carrying invalid UTF-8); raising there would reach the client as UNKNOWN and be logged at ERROR.
The shared server (`mutualrl.common.grpc_server`) parses every body through `parse`, after it
has decided the call may go on, and answers an `UnparsableRequest` with INVALID_ARGUMENT naming
the message type.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class UnparsableRequest:
    """Stands in for a request body that its deserializer refused."""

    message_type: str
    """Full name of the request message (the method's path when the parser does not say)."""
    error: str

    @property
    def message(self) -> str:
        return (f"request: body is not a valid {self.message_type} (string fields must be "
                f"valid UTF-8): {self.error}")


def message_type(method: str, deserializer: Callable[[bytes], Any]) -> str:
    """The full name of the message `deserializer` parses (the method's path when it does not
    say: a generated handler's deserializer is the bound `FromString` of the message class)."""
    descriptor = getattr(getattr(deserializer, "__self__", None), "DESCRIPTOR", None)
    return str(getattr(descriptor, "full_name", method))


def parse(method: str, deserializer: Callable[[bytes], Any], data: bytes) -> Any:
    """`data` parsed, or an `UnparsableRequest` when it does not parse."""
    try:
        return deserializer(data)
    except Exception as err:  # DecodeError, and whatever a custom parser raises on bad bytes
        return UnparsableRequest(message_type(method, deserializer), str(err) or
                                 type(err).__name__)
