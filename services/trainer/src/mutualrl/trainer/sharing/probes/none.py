"""Probe `none`: plain GRPO, no peer reads (the baseline every probe reduces to)."""

from mutualrl.trainer.sharing.probes.base import Probe


class NoneProbe(Probe):
    kind = "none"
