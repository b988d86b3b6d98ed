"""`mutualrl mwra serve`."""

from __future__ import annotations

from mutualrl.common.commands import Commands
from mutualrl.common.flags import deferred_flags, serve_handler

_serve = serve_handler("mwra", "mutualrl.mwra.config", "MwraConfig", "mutualrl.mwra.server")


def register(commands: Commands) -> None:
    p = commands.add(["mwra", "serve"], "Run the MWRA allocator (gRPC) from the run config's "
                     "`mwra:` section; every field is a flag, over the file and the "
                     "environment.", _serve,
                     deferred=deferred_flags("mutualrl.mwra.config", "MwraConfig"))
    p.add_argument("--config", default=None, help="Run YAML (section `mwra:`); defaults apply "
                   "when omitted.")
