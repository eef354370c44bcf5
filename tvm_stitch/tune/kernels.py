"""Tuning each Triton template: random inputs of the right shapes, the template's legality check
and launch options, then Algorithm 1 (:func:`~tvm_stitch.tune.measure.measured_search`).

Used by the Relax passes (through the tuning database) and by the kernel benchmark, so both run
the same search.  With ``on_device=True`` (the default) the functions need a CUDA GPU and
PyTorch; with ``on_device=False`` the analytical model alone picks the tiles.  Every result's
``config`` holds the template parameters and launch options of the best candidate.
"""

from __future__ import annotations

from tvm_stitch.codegen import triton_kernels as tk
from tvm_stitch.explore.tiling import ChainSpec

from .evolution import SearchConfig
from .measure import Tuned, measured_search

#: Algorithm 1's knobs for tuning inside a compile: a small population, few rounds
PASS_SEARCH = SearchConfig(population=64, top_n=8, eps=0.01, max_rounds=4)


def _randn(shape, dtype, scale=1.0):
    import torch

    return torch.randn(shape, device="cuda", dtype=getattr(torch, str(dtype))) * scale


def _bytes(dtype) -> int:
    return 2 if str(dtype) == "float16" else 4


#: tiles measured besides the search's picks (known to suit Hopper's tensor cores): a warpgroup
#: takes 64 rows; FlashAttention runs 64-128 query rows against 32-128 keys
SEEDS = {
    "gemm_epilogue": [
        {"m": m, "n": n, "k": 64} for m, n in ((128, 128), (128, 256), (64, 128), (128, 64))
    ],
    "attention": [{"m": m, "n": n} for m in (64, 128) for n in (32, 64, 128)],
    "gemm_chain": [],
}


def _search(spec, hw, make, legal, config, family, template, on_device, desc) -> Tuned:
    tuned = measured_search(
        spec,
        hw,
        make,
        legal,
        config,
        tk.LAUNCHES[family],
        lambda c: tk.default_launch(template(c)),
        desc=desc,
        on_device=on_device,
        seeds=SEEDS[family],
    )
    tuned.config = {**template(tuned.result.best), **tuned.launch}
    return tuned


def tune_gemm(m, n, k, dtype, hw, config=PASS_SEARCH, on_device=True) -> Tuned:
    """Tiles and launch of ``x (m,k) @ w (n,k)^T + bias`` (the Linear template).

    Epilogues (GELU, residual) are not timed: they add the same work to every tiling.
    """
    spec = ChainSpec.gemm(m, n, k, dtype_bytes=_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (_randn((m, k), dtype), _randn((n, k), dtype, k**-0.5), _randn((n,), dtype))

    def make(cand, launch):
        conf = tk.gemm_config(cand)
        return lambda: tk.run_gemm_epilogue(*inputs, config=conf, **launch)

    tuned = _search(
        spec,
        hw,
        make,
        tk.powers_of_two,
        config,
        "gemm_epilogue",
        tk.gemm_config,
        on_device,
        f"gemm {m}x{n}x{k}",
    )
    tuned.inputs = inputs
    return tuned


def tune_chain(batch, m, n, k, h, dtype, hw, config=PASS_SEARCH, on_device=True) -> Tuned:
    """Tiling of the GEMM chain ``(a @ b) @ d`` for ``a`` (batch, m, k)."""
    spec = ChainSpec.gemm_chain(batch, m, n, k, h, dtype_bytes=_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (
            _randn((batch, m, k), dtype, k**-0.5),
            _randn((batch, k, n), dtype),
            _randn((batch, n, h), dtype, n**-0.5),
        )

    def make(cand, launch):
        conf = tk.chain_config(spec, cand)
        return lambda: tk.run_gemm_chain(*inputs, conf, **launch)

    tuned = _search(
        spec,
        hw,
        make,
        lambda c: tk.chain_legality(spec, c),
        config,
        "gemm_chain",
        lambda c: tk.chain_config(spec, c),
        on_device,
        f"chain {batch}x{m}x{n}x{k}x{h}",
    )
    tuned.inputs = inputs
    return tuned


def tune_attention(
    batch, m, n, dk, dh, dtype, hw, config=PASS_SEARCH, mask=False, on_device=True
) -> Tuned:
    """Tiles of the attention template for ``batch`` (batch · heads) problems of (m, n, dk, dh).

    With ``mask`` an additive (batch, 1, n) mask broadcast over query rows is applied, as in BERT.
    """
    spec = ChainSpec.gemm_chain(batch, m, n, dk, dh, dtype_bytes=_bytes(dtype))
    inputs = ()
    if on_device:
        inputs = (
            _randn((batch, m, dk), dtype),
            _randn((batch, n, dk), dtype),
            _randn((batch, n, dh), dtype),
        )
        if mask:
            inputs += (_randn((batch, 1, n), dtype),)

    def make(cand, launch):
        conf = tk.attention_config(cand)
        return lambda: tk.run_attention(*inputs, config=conf, **launch)

    tuned = _search(
        spec,
        hw,
        make,
        lambda c: tk.attention_legality(spec, c),
        config,
        "attention",
        tk.attention_config,
        on_device,
        f"attention {batch}x{m}x{n}x{dk}x{dh}",
    )
    tuned.inputs = inputs
    return tuned
