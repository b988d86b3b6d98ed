"""Drawing one token per row on the device: temperature, top_k / top_p / min_p truncation, an
inverse-CDF draw from one uniform per row, and a counter-based source of those uniforms.

Nothing here reads a value back to the host, so the HF engine's decode step (sampling
included) can be captured in a CUDA graph. The uniforms come from a counter-based generator:
`uniforms(keys, step)` is a pure function of each row's 64-bit key (from its prompt's seed and
its sample index, `row_keys`) and the decoding step, so a prompt's samples do not depend on
which other prompts share the call, on the batch slot a row occupies, or on the order rows
finish in. It is SplitMix64 (Steele, Lea and Flood, "Fast splittable pseudorandom number
generators", 2014) written in torch's int64 arithmetic, which wraps like unsigned 64-bit
arithmetic in the low bits; `torch.Generator` cannot serve here, as one generator per row
would not be graph-safe and one per call would make a row's draws depend on its neighbours.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

GOLDEN = 0x9E3779B97F4A7C15
"""SplitMix64's increment (2^64 / the golden ratio, odd)."""
MIX1 = 0xBF58476D1CE4E5B9
MIX2 = 0x94D049BB133111EB
MASK64 = (1 << 64) - 1


def _signed(x: int) -> int:
    """A 64-bit unsigned value as torch's int64 holds it."""
    x &= MASK64
    return x - (1 << 64) if x >= 1 << 63 else x


def mix64(x: int) -> int:
    """SplitMix64's finaliser on a Python int (exact, unsigned 64-bit)."""
    z = x & MASK64
    z = ((z ^ (z >> 30)) * MIX1) & MASK64
    z = ((z ^ (z >> 27)) * MIX2) & MASK64
    return z ^ (z >> 31)


def row_keys(seeds: Sequence[int], n: int) -> list[int]:
    """The key of sample j of the prompt with seed s, for each prompt then each of its `n`
    samples (prompt-major), as torch int64 values."""
    return [_signed(mix64(mix64(s & MASK64) + (j + 1) * GOLDEN)) for s in seeds
            for j in range(n)]


def _shr(z: Tensor, bits: int) -> Tensor:
    """Logical right shift of int64 values (torch's `>>` keeps the sign)."""
    return (z >> bits) & ((1 << (64 - bits)) - 1)


def uniforms(keys: Tensor, step: int | Tensor) -> Tensor:
    """[R] float64 uniforms in [0, 1): SplitMix64's output number `step + 1` of the stream
    that starts at each row's key. `step` is an int or a 0-d int64 tensor on the keys'
    device (a CUDA graph replays with the step it reads from that tensor)."""
    # A Python step is reduced to int64 here; a tensor step wraps in the product itself.
    z = keys + (_signed((step + 1) * GOLDEN) if isinstance(step, int)
                else (step + 1) * _signed(GOLDEN))
    z = (z ^ _shr(z, 30)) * _signed(MIX1)
    z = (z ^ _shr(z, 27)) * _signed(MIX2)
    z = z ^ _shr(z, 31)
    return _shr(z, 11).to(torch.float64) * 2.0**-53


def reference_uniform(key: int, step: int) -> float:
    """`uniforms` for one row in plain Python (the definition the tensor version must meet)."""
    z = mix64((key & MASK64) + (step + 1) * GOLDEN)
    return (z >> 11) * 2.0**-53


def draw(logits: Tensor, temperature: float, truncation: tuple[int, float, float],
         u: Tensor | None) -> tuple[Tensor, Tensor]:
    """(token, log-prob under log_softmax(logits / T)) per row, the token drawn by inverting
    the truncated distribution's CDF at `u` (one uniform per row); T == 0 is greedy (the
    log-prob is then the untempered one). `truncation` is (top_k, top_p, min_p)."""
    if temperature <= 0:
        logp = torch.log_softmax(logits, dim=-1)
        tok = logp.argmax(dim=-1)
        return tok, logp.gather(-1, tok[:, None]).squeeze(-1)
    assert u is not None
    logp = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)
    tok = inverse_cdf(truncate(logp.exp(), *truncation), u)
    return tok, logp.gather(-1, tok[:, None]).squeeze(-1)


def truncate(probs: Tensor, top_k: int, top_p: float, min_p: float) -> Tensor:
    """`probs` with the entries top_k, then top_p, then min_p leave out set to 0 (not
    renormalised: the draw scales by the row's total). Ties with the last entry kept stay."""
    if 0 < top_k < probs.shape[-1]:
        kth = probs.topk(top_k, dim=-1).values[:, -1:]
        probs = probs * (probs >= kth)
    if top_p < 1.0:
        # Nucleus: the smallest prefix of the sorted distribution with mass >= top_p of what
        # top_k left, kept as a threshold on the probabilities (no scatter back).
        sp = probs.sort(dim=-1, descending=True).values
        mass = top_p if top_k == 0 else top_p * sp.sum(-1, keepdim=True)
        kept = ((sp.cumsum(-1) - sp) < mass).sum(-1, keepdim=True)
        probs = probs * (probs >= sp.gather(-1, kept.clamp(min=1) - 1))
    if min_p > 0.0:
        probs = probs * (probs >= min_p * probs.max(dim=-1, keepdim=True).values)
    return probs


def _last_with_mass(mass: Tensor) -> Tensor:
    """[R] index of each row's last entry with mass > 0 (0 for a row without any)."""
    width = mass.shape[-1]
    return width - 1 - (mass.flip(-1) > 0).to(torch.uint8).argmax(-1)


def inverse_cdf(probs: Tensor, u: Tensor, block: int = 1024) -> Tensor:
    """[R] index of the first entry whose cumulative mass (float64) exceeds `u` times the row's
    total, so an entry of probability 0 is never drawn: its cumulative mass equals its
    predecessor's. Two levels, so the cumulative sum never runs over the whole vocabulary (one
    float64 cumsum over 151,936 entries cost more than the rest of a sampling step): the
    block of `block` entries is drawn from the blocks' sums, then the entry within it. Should
    rounding put the draw past the last entry of mass (of the row, or of the block the draw
    fell in), that entry takes it. No value is read back to the host."""
    rows, v = probs.shape
    block = min(block, v)  # a small vocabulary is one block
    full = v // block * block
    # A block's sum in the probabilities' own dtype is accurate enough (pairwise summation of
    # 1,024 entries) and spares a float64 copy of the whole row.
    sums = [probs[:, :full].reshape(rows, full // block, block).sum(-1)]
    if full < v:
        sums.append(probs[:, full:].sum(-1, keepdim=True))
    block_sums = torch.cat(sums, dim=-1)
    block_cdf = block_sums.cumsum(-1, dtype=torch.float64)
    target = u * block_cdf[:, -1]
    b = torch.searchsorted(block_cdf, target[:, None], right=True).squeeze(-1)
    b = b.clamp(max=block_cdf.shape[-1] - 1)
    empty = block_sums.gather(-1, b[:, None]).squeeze(-1) <= 0
    b = torch.where(empty, _last_with_mass(block_sums), b)
    before = torch.where(b > 0, block_cdf.gather(-1, (b - 1).clamp(min=0)[:, None]).squeeze(-1),
                         torch.zeros_like(target))
    cols = b[:, None] * block + torch.arange(block, device=probs.device)
    inside = probs.gather(-1, cols.clamp(max=v - 1)) * (cols < v)
    j = torch.searchsorted(inside.cumsum(-1, dtype=torch.float64), (target - before)[:, None],
                           right=True).squeeze(-1).clamp(max=block - 1)
    zero = inside.gather(-1, j[:, None]).squeeze(-1) <= 0
    j = torch.where(zero, _last_with_mass(inside), j)
    return (b * block + j).clamp(max=v - 1)
