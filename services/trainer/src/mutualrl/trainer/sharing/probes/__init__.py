"""Sharing probes over the pure core: `none`, `xgrpo`, `sgt`, `prp`, SGT's controls `sgt-self`
and `oracle`, and the published collaborative methods `hacpo` (with its ablation
`hacpo-naive`), `sapo` and `ftis`."""

from __future__ import annotations

from mutualrl.trainer.algos.modes import ScaleRewards
from mutualrl.trainer.config.run import ExchangeSettings, ProbeSettings
from mutualrl.trainer.data.tasks import Task
from mutualrl.trainer.sharing.exchange import PeerExchange
from mutualrl.trainer.sharing.probes.base import Demos, LossInputs, PeerRows, Probe, RoundData
from mutualrl.trainer.sharing.probes.ftis import FTISProbe
from mutualrl.trainer.sharing.probes.hacpo import HACPONaiveProbe, HACPOProbe
from mutualrl.trainer.sharing.probes.none import NoneProbe
from mutualrl.trainer.sharing.probes.prp import PRPProbe
from mutualrl.trainer.sharing.probes.sapo import SAPOProbe
from mutualrl.trainer.sharing.probes.sgt import OracleProbe, SGTProbe, SGTSelfProbe
from mutualrl.trainer.sharing.probes.xgrpo import XGRPOProbe

PROBES: dict[str, type[Probe]] = {
    p.kind: p for p in (NoneProbe, XGRPOProbe, SGTProbe, PRPProbe, SGTSelfProbe, OracleProbe,
                        HACPOProbe, HACPONaiveProbe, SAPOProbe, FTISProbe)
}


def make_probe(settings: ProbeSettings, policy: str, exchange: PeerExchange | None,
               task: Task | None = None, scale: ScaleRewards = "group",
               sharing: ExchangeSettings | None = None) -> Probe:
    """The probe of `settings.kind`; `task` gives reference answers (the `oracle` control),
    `scale` what advantages are divided by (`grpo.scale_rewards`), `sharing` how rounds read
    peers (None: asynchronous)."""
    return PROBES[settings.kind](settings, policy, exchange, task, scale, sharing)


__all__ = ["PROBES", "Demos", "LossInputs", "PeerRows", "Probe", "RoundData", "make_probe"]
