"""Which of THL's RPCs the scoped tokens may call (`mutualrl.common.auth`): tokenizing and
aligning are open to any valid token; registering tokenizers and deleting runs take the run's
secret itself."""

from __future__ import annotations

from mutualrl.common.auth import READ, Rules
from mutualrl.v1 import alignment_pb2 as pb

_SERVICE = pb.DESCRIPTOR.services_by_name["Alignment"].full_name

ACCESS: Rules = {f"/{_SERVICE}/{name}": READ
                 for name in ("ListTokenizers", "Retokenize", "AlignTrace")}
