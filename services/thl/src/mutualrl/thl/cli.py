"""`mutualrl thl serve`."""

from __future__ import annotations

from mutualrl.common.commands import Commands
from mutualrl.common.flags import deferred_flags, serve_handler

_serve = serve_handler("thl", "mutualrl.thl.config", "ThlConfig", "mutualrl.thl.server")


def register(commands: Commands) -> None:
    p = commands.add(["thl", "serve"], "Run the THL gRPC service (section `thl:` of the config; "
                     "every field is a flag, over the file and the environment).", _serve,
                     deferred=deferred_flags("mutualrl.thl.config", "ThlConfig"))
    p.add_argument("--config", default=None, help="Run YAML; its `thl:` section is read.")
