"""Sharing probes over the pure core: `none`, `xgrpo`, `sgt`, `prp`."""

from __future__ import annotations

from mutualrl.trainer.config import ProbeSettings
from mutualrl.trainer.exchange import PeerExchange
from mutualrl.trainer.probes.base import Demos, LossInputs, PeerRows, Probe, RoundData
from mutualrl.trainer.probes.none import NoneProbe
from mutualrl.trainer.probes.prp import PRPProbe
from mutualrl.trainer.probes.sgt import SGTProbe
from mutualrl.trainer.probes.xgrpo import XGRPOProbe

PROBES: dict[str, type[Probe]] = {
    p.kind: p for p in (NoneProbe, XGRPOProbe, SGTProbe, PRPProbe)
}


def make_probe(settings: ProbeSettings, policy: str, exchange: PeerExchange | None) -> Probe:
    return PROBES[settings.kind](settings, policy, exchange)


__all__ = ["PROBES", "Demos", "LossInputs", "PeerRows", "Probe", "RoundData", "make_probe"]
