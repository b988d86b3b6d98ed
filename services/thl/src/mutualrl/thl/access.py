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

from typing import Any

from mutualrl.common.auth import READ, Access, Rules
from mutualrl.common.errors import quote
from mutualrl.v1 import alignment_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Alignment"].full_name


def _registrant(request: Any) -> list[str]:
    """The policy a RegisterTokenizer acts as: `<policy>` of a `<run_id>/<policy>` id under
    the request's own run_id; any other id is named whole (no policy token matches it)."""
    run_id, tokenizer_id = request.run_id, request.tokenizer_id
    prefix = f"{run_id}/"
    if run_id and tokenizer_id.startswith(prefix) and "/" not in tokenizer_id[len(prefix):]:
        return [tokenizer_id[len(prefix):]]
    return [f"tokenizer {quote(tokenizer_id)} of run {quote(run_id)}"]


ACCESS: Rules = {
    **{f"/{_SERVICE}/{name}": READ for name in ("ListTokenizers", "Retokenize", "AlignTrace")},
    f"/{_SERVICE}/RegisterTokenizer": Access(acts_as=_registrant),
}
