"""The data-parallel helpers that need no process group: how rows split over ranks, and the
one-process `Dist` being the identity."""

from __future__ import annotations

import torch

from mutualrl.trainer.runtime.distributed import SINGLE, block, launched


def test_blocks_tile_the_items_in_order_and_differ_by_at_most_one() -> None:
    for n in range(0, 12):
        for world in range(1, 6):
            parts = [block(n, r, world) for r in range(world)]
            assert [i for p in parts for i in p] == list(range(n))
            sizes = [len(p) for p in parts]
            assert max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)  # the first ranks take the extra ones


def test_one_process_is_the_identity() -> None:
    t = torch.tensor([1.5, 2.0])
    assert SINGLE.sum(t) is t
    assert SINGLE.all_gather("x") == ["x"]
    assert SINGLE.from_main(lambda: 7) == 7
    assert SINGLE.any(True) and not SINGLE.any(False)
    assert SINGLE.block(5) == range(5)
    assert SINGLE.main and not SINGLE.active


def test_a_plain_process_is_not_a_launched_rank(monkeypatch) -> None:
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    assert not launched()
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    monkeypatch.setenv("RANK", "1")
    assert launched()
