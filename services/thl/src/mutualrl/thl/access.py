"""Which of THL's RPCs the scoped tokens may call (`mutualrl.common.auth`): tokenizing and
aligning are open to any valid token; a policy's token registers its own policy's tokenizer
only; registering other tokenizers and deleting runs take the run's secret itself.

A policy token is derived from the secret, not from a run, so a policy's scope is its name in
every run under that secret. The one tokenizer it may register is `<run_id>/<policy>` (the id
trainers give their tokenizer, `TrainerConfig.tokenizer_id`) for the `run_id` the request
names, so the registration is released with that run and cannot replace a tokenizer other
policies or people use. The path it names must still lie under THL's `tokenizer_roots`, as
for the admin."""

from __future__ import annotations

from collections.abc import Mapping

from google.protobuf.descriptor import Descriptor

from mutualrl.common.auth import READ, Access, Rules, strings_of
from mutualrl.common.errors import quote
from mutualrl.thl.config import ThlConfig
from mutualrl.v1 import alignment_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Alignment"].full_name
_RUN_ID, _TOKENIZER_ID = strings_of("run_id"), strings_of("tokenizer_id")


def _registrant(data: bytes, message: Descriptor) -> list[str]:
    """The policy a RegisterTokenizer acts as (from its bytes): `<policy>` of a
    `<run_id>/<policy>` id under the request's own run_id; any other id is named whole (no
    policy token matches it)."""
    run_id, = _RUN_ID(data, message)
    tokenizer_id, = _TOKENIZER_ID(data, message)
    prefix = f"{run_id}/"
    if run_id and tokenizer_id.startswith(prefix) and "/" not in tokenizer_id[len(prefix):]:
        return [tokenizer_id[len(prefix):]]
    return [f"tokenizer {quote(tokenizer_id)} of run {quote(run_id)}"]


ACCESS: Rules = {
    **{f"/{_SERVICE}/{name}": READ for name in ("ListTokenizers", "Retokenize", "AlignTrace")},
    f"/{_SERVICE}/RegisterTokenizer": Access(acts_as=_registrant),
}

_TEXT_FRAMING = 16
"""Bytes a RetokenizeRequest spends on each text besides its UTF-8 (tag and length)."""


def large_requests(cfg: ThlConfig) -> Mapping[str, int]:
    """THL's methods whose requests may pass `max_request_bytes`: AlignTrace's (its items
    carry traces; its rules are checked from the request's lengths) up to
    `max_message_bytes`, Retokenize's up to its text limit and framing."""
    return {f"/{_SERVICE}/AlignTrace": cfg.max_message_bytes,
            f"/{_SERVICE}/Retokenize": (cfg.max_request_text_bytes + cfg.max_batch * _TEXT_FRAMING
                                        + 64 * 1024)}
