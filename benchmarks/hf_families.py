"""Hugging Face model families as users bring them, through ``from_torch``.

    python -m tvm_stitch.benchmarks.hf_families [--attn sdpa|eager] [--mask] [--gpu [--held]]
                                                [--seq S] [--head-dim D] [--zoo]
                                                [--only NAME ...]

Each family is built by ``transformers`` from a small config with random weights (two layers,
a head dimension of 48, grouped K/V heads where the family has them), in the attention
implementation ``transformers`` picks by default (``sdpa``) unless ``--attn`` says otherwise,
and called with token ids, pixels or audio features of batch 2.  For each:

- ``llvm``: ``tvm_stitch.from_torch(model, inputs, target="llvm")`` against PyTorch (float32);
- ``cuda``: the float16 import compiled for ``sm_90a`` (no GPU needed), TVM's CUDA C through
  ``nvcc`` where there is one: the kernels generated in Triton by family, and what the passes
  left to TVM (their log lines).

With ``--mask`` token models also take an ``attention_mask`` (the second sequence left-padded:
in a causal model its first rows see no key).  With ``--gpu`` (a GPU host) the ``cuda`` column
runs ``from_torch(..., target="cuda", tune="model")`` on the GPU against the float32 reference
instead (float16 tolerances; PyTorch's own float16 error beside it; padding rows whose value
PyTorch's own float16 and float32 disagree on are reported apart, not judged) and llvm is
skipped; with ``--held`` as well, ``from_torch`` takes the model as a user holds it on the GPU
(``model.to(dtype).cuda()``, CUDA example inputs) instead of the float32 one on the CPU.  A
``WRONG`` or ``failed`` row makes the exit status 1.

With ``--zoo``, the zoo's models instead (:data:`ZOO`: GPT-2, LLaMA and ViT at the zoo's tiny
sizes, Hugging Face BERT-tiny, attention written in plain PyTorch, masked and filled).

Nothing is timed: this is the generality check (which models import, build, compute what
PyTorch computes, and get their attention and GEMMs recognized).
"""

from __future__ import annotations

import argparse
import io
import logging

import numpy as np

from tvm_stitch.errors import error_line

_LAYERS = dict(num_hidden_layers=2)
_ENC = dict(hidden_size=96, num_attention_heads=2, intermediate_size=200, vocab_size=500,
            max_position_embeddings=128, **_LAYERS)
_DEC = dict(_ENC, num_key_value_heads=1)
_SEQ2SEQ = dict(d_model=96, encoder_attention_heads=2, decoder_attention_heads=2,
                encoder_ffn_dim=200, decoder_ffn_dim=200, encoder_layers=2, decoder_layers=2,
                vocab_size=500)

#: name -> (config class, model class, config, inputs); inputs: "ids", "pixels:SIZE", "mel";
#: a model class ending in ".encoder" is the encoder of an encoder-decoder model
FAMILIES = {
    "distilbert": ("DistilBertConfig", "DistilBertModel",
                   dict(dim=96, n_heads=2, hidden_dim=200, n_layers=2, vocab_size=500), "ids"),
    "roberta": ("RobertaConfig", "RobertaModel", _ENC, "ids"),
    "albert": ("AlbertConfig", "AlbertModel", dict(_ENC, embedding_size=64), "ids"),
    "electra": ("ElectraConfig", "ElectraModel", dict(_ENC, embedding_size=64), "ids"),
    "deberta-v2": ("DebertaV2Config", "DebertaV2Model", _ENC, "ids"),
    "mpnet": ("MPNetConfig", "MPNetModel", _ENC, "ids"),
    "t5-encoder": ("T5Config", "T5EncoderModel",
                   dict(d_model=96, d_kv=48, d_ff=200, num_layers=2, num_heads=2,
                        vocab_size=500), "ids"),
    "gpt2": ("GPT2Config", "GPT2Model",
             dict(n_embd=96, n_head=2, n_layer=2, vocab_size=500, bos_token_id=0,
                  eos_token_id=0), "ids"),
    "llama": ("LlamaConfig", "LlamaModel", _DEC, "ids"),
    "mistral": ("MistralConfig", "MistralModel", _DEC, "ids"),
    "qwen2": ("Qwen2Config", "Qwen2Model", _DEC, "ids"),
    "qwen3": ("Qwen3Config", "Qwen3Model", dict(_DEC, head_dim=48), "ids"),
    "gemma": ("GemmaConfig", "GemmaModel", dict(_DEC, head_dim=48), "ids"),
    "gemma2": ("Gemma2Config", "Gemma2Model", dict(_DEC, head_dim=48), "ids"),
    "phi": ("PhiConfig", "PhiModel", _ENC, "ids"),
    "phi3": ("Phi3Config", "Phi3Model", dict(_DEC, pad_token_id=0), "ids"),
    "gpt-neox": ("GPTNeoXConfig", "GPTNeoXModel", _ENC, "ids"),
    "opt": ("OPTConfig", "OPTModel",
            dict(hidden_size=96, num_attention_heads=2, ffn_dim=200, vocab_size=500,
                 word_embed_proj_dim=96, **_LAYERS), "ids"),
    "falcon": ("FalconConfig", "FalconModel",
               dict(hidden_size=96, num_attention_heads=2, vocab_size=500, **_LAYERS), "ids"),
    "bloom": ("BloomConfig", "BloomModel",
              dict(hidden_size=96, n_head=2, n_layer=2, vocab_size=500), "ids"),
    "gptj": ("GPTJConfig", "GPTJModel",
             dict(n_embd=96, n_head=2, n_layer=2, n_inner=200, vocab_size=500, rotary_dim=16,
                  n_positions=128), "ids"),
    "clip-text": ("CLIPTextConfig", "CLIPTextModel", _ENC, "ids"),
    "bart-encoder": ("BartConfig", "BartModel.encoder",
                     dict(_SEQ2SEQ, max_position_embeddings=128), "ids"),
    "vit": ("ViTConfig", "ViTModel", dict(_ENC, image_size=48, patch_size=8), "pixels:48"),
    "clip-vision": ("CLIPVisionConfig", "CLIPVisionModel",
                    dict(_ENC, image_size=48, patch_size=8), "pixels:48"),
    "dinov2": ("Dinov2Config", "Dinov2Model", dict(_ENC, image_size=48, patch_size=8),
               "pixels:48"),
    "swin": ("SwinConfig", "SwinModel",
             dict(image_size=64, patch_size=4, embed_dim=32, depths=[2, 2], num_heads=[2, 4],
                  window_size=4), "pixels:64"),
    "whisper-encoder": ("WhisperConfig", "WhisperModel.encoder",
                        dict(_SEQ2SEQ, pad_token_id=0, num_mel_bins=16,
                             max_source_positions=20), "mel"),
    "mixtral": ("MixtralConfig", "MixtralModel",
                dict(_DEC, num_local_experts=4, num_experts_per_tok=2), "ids"),
    # sliding windows: Mistral's (causal, 16 keys) and ModernBERT's local layers (8 keys on
    # either side) between global ones
    "mistral-window": ("MistralConfig", "MistralModel", dict(_DEC, sliding_window=16), "ids"),
    "modernbert": ("ModernBertConfig", "ModernBertModel",
                   dict(_ENC, local_attention=16, global_attn_every_n_layers=2, pad_token_id=0,
                        eos_token_id=1, bos_token_id=2, cls_token_id=2, sep_token_id=1),
                   "ids"),
}


#: the zoo's models (``tvm_stitch.workloads``) as the sweep takes them: its ``transformers``
#: models at their tiny sizes, Hugging Face BERT, and attention written in plain PyTorch
#: (``--zoo``)
ZOO = ("zoo-gpt2", "zoo-llama", "zoo-vit", "zoo-hf-bert", "zoo-attention",
       "zoo-masked-attention", "zoo-filled-attention")


#: config keys of a model's width (two heads of ``head_dim``), of one head's, and of positions
_WIDTH = ("hidden_size", "dim", "n_embd", "d_model", "word_embed_proj_dim", "embed_dim")
_HEAD = ("d_kv", "head_dim")
_POSITIONS = ("max_position_embeddings", "n_positions")


def _resized(config: dict, head_dim: int | None, seq: int, tokens: bool) -> dict:
    """``config`` with heads of ``head_dim`` (the width twice that: two heads) and, for a model
    of ``tokens``, positions for ``seq`` of them."""
    config = dict(config)
    if head_dim:
        for key in _WIDTH:
            if key in config:
                config[key] = 2 * head_dim
        for key in _HEAD:
            if key in config:
                config[key] = head_dim
    positions = [key for key in _POSITIONS if key in config] or ["max_position_embeddings"]
    for key in positions if tokens else ():  # DistilBERT's has none: its default (512) grows
        config[key] = max(config.get(key, 512), seq + 2)
    return config


def build(name: str, attn: str | None, seq: int = 37, mask: bool = False,
          head_dim: int | None = None):
    """``(module, inputs)``: the family's model (random weights, 1-D parameters perturbed so a
    lost bias shows) returning its last hidden state, and inputs of batch 2 (``seq`` tokens);
    with ``mask``, a token family also takes an ``attention_mask`` whose second sequence starts
    with up to 11 padding tokens (left padding, as batched generation pads).  ``head_dim``
    resizes the model to two heads of that size (default: the table's, mostly 48)."""
    import torch
    import transformers

    from tvm_stitch.frontend import _without_cache
    from tvm_stitch.workloads.zoo import last_hidden, perturb_vectors

    if name in ZOO:
        return _zoo(name, attn, seq, mask)
    cfg_cls, model_cls, config, kind = FAMILIES[name]
    extra = {"attn_implementation": attn} if attn else {}
    torch.manual_seed(0)
    cfg = getattr(transformers, cfg_cls)(**_resized(config, head_dim, seq, kind == "ids"),
                                         **extra)
    cls, _, part = model_cls.partition(".")
    net = getattr(transformers, cls)(cfg)
    net = getattr(net, part) if part else net
    perturb_vectors(net)
    gen = torch.Generator().manual_seed(1)
    names = ()  # passed positionally
    if kind == "ids":
        inputs = (torch.randint(0, 500, (2, seq), generator=gen),)
        if mask:
            pad = torch.ones(2, seq, dtype=torch.int64)
            pad[1, :min(11, seq - 1)] = 0
            inputs, names = (*inputs, pad), ("input_ids", "attention_mask")
    elif kind == "mel":
        inputs = (torch.randn(2, config["num_mel_bins"], 40, generator=gen),)
    else:
        size = int(kind.partition(":")[2])
        inputs = (torch.randn(2, 3, size, size, generator=gen),)
    # the wrapper's own forward takes no use_cache: the model's is set here
    return last_hidden(net, _without_cache(net, {}), names).eval(), inputs


def _zoo(name: str, attn: str | None, seq: int, mask: bool):
    """:func:`build` of a :data:`ZOO` model: batch 2, ``seq`` tokens (attention: 2 heads of
    64), the key mask of ``--mask`` where the model takes one."""
    import torch

    from tvm_stitch.workloads import zoo
    from tvm_stitch.workloads.bert import BERT_CONFIGS
    from tvm_stitch.workloads.hf_bert import make_hf_bert

    gen = torch.Generator().manual_seed(1)
    kind = name.removeprefix("zoo-")
    if kind.endswith("attention"):
        q, k, v = (torch.randn(2, 2, seq, 64, generator=gen) for _ in range(3))
        if kind == "attention":
            return zoo.plain_attention(causal=True).eval(), (q, k, v)
        make = zoo.masked_attention if kind == "masked-attention" else zoo.filled_attention
        keys = torch.from_numpy(zoo.key_mask(2, seq) if mask else np.ones((2, seq), bool))
        return make(causal=True).eval(), (q, k, v, keys)
    torch.manual_seed(0)
    if kind == "hf-bert":
        net = make_hf_bert(BERT_CONFIGS["tiny"], attn or "sdpa")
        zoo.perturb_vectors(net)
        cfg, kwargs, names = net.config, {}, ("input_ids", "attention_mask")
    else:
        model = zoo.MODELS[kind]
        net = zoo.make_model(model, "tiny", attn or "sdpa")
        cfg, kwargs, names = net.config, model.kwargs, ("input_ids", "attention_mask")
    if kind == "vit":
        inputs = (torch.randn(2, cfg.num_channels, cfg.image_size, cfg.image_size,
                              generator=gen),)
        return zoo.last_hidden(net, kwargs).eval(), inputs
    ids = torch.randint(0, cfg.vocab_size, (2, seq), generator=gen)
    if not mask:
        return zoo.last_hidden(net, kwargs).eval(), (ids,)
    pad = torch.ones(2, seq, dtype=torch.int64)
    pad[1, :min(11, seq - 1)] = 0
    return zoo.last_hidden(net, kwargs, names).eval(), (ids, pad)


def _verdict(out, ref, rtol: float, atol: float, padded=None, theirs=None,
             dtype: str = "float16") -> str:
    """``ok``/``WRONG`` and the largest error of ``out`` against ``ref``.

    ``padded`` (a boolean ``(batch, seq)`` array): rows of padding tokens.  With ``theirs``
    (PyTorch's output in ``dtype`` on the same device) the padding rows whose value PyTorch's
    16-bit and float32 outputs do not agree on are left out of the verdict and reported apart — ours
    against each: a left-padded row of a causal model sees no key, and what it holds may
    depend on the precision (a float32 minimum added to a logit absorbs it in float32, not once
    the mask is float16's -65504; PyTorch's float16 kernels also give most rows of a boolean
    mask other values than its float32 zeros).  Every other row is judged (an encoder's
    padding rows see the real keys); where no row is, the error is 0."""
    judged = np.ones(out.shape[:-1], dtype=bool)
    if padded is not None and theirs is not None:
        judged = ~(padded & ~np.isclose(theirs, ref, rtol, atol).all(-1))
    err = float(np.abs(out[judged] - ref[judged]).max(initial=0.0))
    ok = np.allclose(out[judged], ref[judged], rtol, atol)

    def rows_off(x):  # rows (tokens) outside the tolerance: a few where a router's choice
        # flips with the rounding (a mixture of experts), most where a kernel is wrong
        return f"{int((~np.isclose(x[judged], ref[judged], rtol, atol).all(-1)).sum())} of " \
               f"{int(judged.sum())} rows off"

    text = f"{'ok' if ok else 'WRONG'}, max err {err:.1e}" + ("" if ok else f", {rows_off(out)}")
    if theirs is not None:
        theirs_err = float(np.abs(theirs[judged] - ref[judged]).max(initial=0.0))
        short = {"float16": "fp16", "bfloat16": "bf16"}.get(dtype, dtype)
        theirs_ok = np.allclose(theirs[judged], ref[judged], rtol, atol)
        text += f" (PyTorch {short} {theirs_err:.1e}" + \
            ("" if ok or theirs_ok else f", {rows_off(theirs)}") + ")"
    if not judged.all():
        loose = ~judged
        text += (f"; {int(loose.sum())} padding rows PyTorch leaves undefined: ours vs its "
                 f"{dtype} {float(np.abs(out[loose] - theirs[loose]).max()):.1e}, vs its "
                 f"float32 {float(np.abs(out[loose] - ref[loose]).max()):.1e}")
    return text


def _on_llvm(model, inputs, ref) -> str:
    """``from_torch`` on the CPU (float32) against the reference ``ref``."""
    import tvm_stitch

    try:
        out = tvm_stitch.from_torch(model, inputs, target="llvm")(*inputs).numpy()
    except Exception as err:  # noqa: BLE001 - the row says what failed
        return f"failed: {type(err).__name__}: {error_line(err)}"[:160]
    return _verdict(out, ref, 0.0, 1e-4 * max(1.0, float(np.abs(ref).max())))


def _built(model, inputs, dtype: str = "float16") -> str:
    """The ``dtype`` import compiled for sm_90a with ``from_torch``'s options (no GPU
    needed)."""
    import tvm

    import tvm_stitch
    from tvm_stitch.frontend import default_options, import_torch
    from tvm_stitch.pipeline import as_target
    from tvm_stitch.report import nvcc_error

    imported = import_torch(model, inputs, dtype)
    target = as_target({"kind": "cuda", "arch": "sm_90a"})
    options = default_options(target)  # as from_torch compiles for CUDA
    ex = tvm.compile(imported.mod, target, relax_pipeline=tvm_stitch.pipeline(target, **options))
    why = nvcc_error(ex)  # TVM's CUDA C, compiled only on the GPU host otherwise
    return f"failed: nvcc: {why}" if why else "built"


def _on_gpu(model, inputs, ref, padded, dtype: str = "float16", held: bool = False,
            compare: dict | None = None) -> str:
    """``from_torch`` on the GPU (``dtype``, the cost model's tiles) against the float32
    reference ``ref``, beside PyTorch's own error in ``dtype`` on the same GPU; with ``held``,
    ``from_torch`` takes that PyTorch model (in ``dtype`` on the GPU) and CUDA inputs. With
    ``compare`` (pipeline options), that build is judged too, and both are timed in turns:
    ``"<verdict>; <default µs> vs <compare µs>"``."""
    import copy

    import torch

    import tvm_stitch
    from tvm_stitch.workloads.base import TOLERANCES

    args = [x.cuda() for x in inputs]
    theirs_args = [x.to(getattr(torch, dtype)) if x.is_floating_point() else x for x in args]
    half = None
    try:
        half = copy.deepcopy(model).to(getattr(torch, dtype)).cuda()
        with torch.no_grad():
            theirs = half(*theirs_args)
        theirs = theirs.float().cpu().numpy()
    except Exception as err:  # ours is still judged, every row
        if held:
            raise
        logging.getLogger(__name__).warning("PyTorch %s failed: %s", dtype, err)
        theirs = None
    example = (half, theirs_args) if held else (model, inputs)
    compiled = tvm_stitch.from_torch(*example, target="cuda", dtype=dtype, tune="model")
    out = compiled(*args).float().cpu().numpy()
    verdict = _verdict(out, ref, *TOLERANCES[dtype], padded, theirs, dtype)
    if compare is None:
        return verdict
    try:  # the second build's failure is its own: the first's verdict stays
        other = tvm_stitch.from_torch(*example, target="cuda", dtype=dtype,
                                      **{"tune": "model", **compare})
        out = other(*args).float().cpu().numpy()
    except Exception as err:  # noqa: BLE001 - the row says what failed
        return f"{verdict} / failed: {type(err).__name__}: {error_line(err)}"[:200]
    other_verdict = _verdict(out, ref, *TOLERANCES[dtype], padded, theirs, dtype)
    times = _timed_in_turns([compiled, other], args)
    return f"{verdict} / {other_verdict}; {times[0]:.1f} vs {times[1]:.1f} us"


def _timed_in_turns(built, args, rounds: int = 5) -> list:
    """Median µs per call of each of ``built``, timed in turns (``rounds`` times each, 200 ms
    a time, one call at a time between CUDA events: each build replays its own CUDA graph;
    :func:`~tvm_stitch.benchmarks.harness.in_turns`). A build whose timing fails raises."""
    from tvm_stitch.benchmarks.harness import in_turns

    from tvm_stitch.tune.measure import torch_timer

    timers = [torch_timer(c, args, "cuda", graph=False) for c in built]
    times = in_turns(timers, rounds, budget_ms=200.0 * rounds)
    for t in times:
        if isinstance(t, Exception):
            raise t
    return times


def check(name: str, attn: str | None, mask: bool = False, gpu: bool = False,
          seq: int = 37, head_dim: int | None = None, dtype: str = "float16",
          held: bool = False, compare: dict | None = None) -> dict:
    """One family through ``from_torch`` on llvm (numerics, float32) and a CUDA build in
    ``dtype`` (kernels); with ``gpu``, through ``from_torch`` on the GPU in ``dtype`` instead
    (numerics), given the model on the GPU in ``dtype`` with ``held``."""
    import torch

    row = {"model": name}
    try:
        model, inputs = build(name, attn, seq=seq, mask=mask, head_dim=head_dim)
    except Exception as err:  # noqa: BLE001 - a config this transformers does not take
        row["llvm"] = row["cuda"] = f"not built: {type(err).__name__}: {err}"[:160]
        return row
    row["attn"] = getattr(getattr(getattr(model, "inner", None), "config", None),
                          "_attn_implementation", "")
    with torch.no_grad():
        ref = model(*inputs).numpy()
    # rows of padding tokens: the mask's zeros (token models with --mask)
    padded = (inputs[1] == 0).numpy() if mask and len(inputs) == 2 else None
    row["llvm"] = "-" if gpu else _on_llvm(model, inputs, ref)
    log = io.StringIO()
    handler = logging.StreamHandler(log)
    logger = logging.getLogger("tvm_stitch")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        row["cuda"] = (_on_gpu(model, inputs, ref, padded, dtype, held, compare) if gpu
                       else _built(model, inputs, dtype))
    except Exception as err:  # noqa: BLE001
        row["cuda"] = f"failed: {type(err).__name__}: {error_line(err)}"[:160]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    lines = log.getvalue().splitlines()
    row["kernels"] = next((x.split(": ", 1)[1] for x in lines
                           if x.startswith("Triton kernels:")), "")
    row["left"] = [x for x in lines
                   if "left to TVM" in x or x.startswith("Triton kernels not used")]
    return row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--attn", choices=["sdpa", "eager"], default=None,
                        help="attention implementation (default: what transformers picks)")
    parser.add_argument("--only", nargs="*", choices=sorted([*FAMILIES, *ZOO]), default=None)
    parser.add_argument("--zoo", action="store_true",
                        help="the zoo's models instead of the families (" + ", ".join(ZOO) + ")")
    parser.add_argument("--names", action="store_true",
                        help="print the names the other flags select, one a line, and stop")
    parser.add_argument("--mask", action="store_true",
                        help="token models also take an attention mask (left padding)")
    parser.add_argument("--gpu", action="store_true",
                        help="on a GPU host: run the compiled 16-bit model on the GPU (the "
                        "cost model's tiles) against PyTorch float32, instead of llvm + a build")
    parser.add_argument("--held", action="store_true",
                        help="with --gpu: give from_torch the model as a user holds it, in "
                        "--dtype on the GPU with CUDA inputs")
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], default="float16",
                        help="the CUDA side's dtype (the llvm check is float32)")
    parser.add_argument("--seq", type=int, default=37, help="tokens a sequence (default 37)")
    parser.add_argument("--head-dim", type=int, default=None,
                        help="heads of this size, two a layer (Swin: two, then four; default: "
                        "each family's table, mostly 48)")
    parser.add_argument("--compare", metavar="KEY=VALUE[,KEY=VALUE]", default=None,
                        help="with --gpu: also build with these pipeline options, judge both "
                        "and time them in turns (e.g. explore=search)")
    args = parser.parse_args(argv)
    if args.held and not args.gpu:
        parser.error("--held runs on the GPU: give --gpu too")
    if args.compare and not args.gpu:
        parser.error("--compare times on the GPU: give --gpu too")
    from tvm_stitch.cli import parse_options

    compare = parse_options(args.compare, "--compare") if args.compare else None
    names = args.only or (ZOO if args.zoo else list(FAMILIES))
    if args.names:
        print(*names, sep="\n")
        return 0
    bad = 0
    print(f"{'model':16s} {'attn':6s} {'llvm (from_torch)':28s} {'cuda build':10s} kernels")
    for name in names:
        row = check(name, args.attn, args.mask, args.gpu, args.seq, args.head_dim, args.dtype,
                    args.held, compare)
        print(f"{name:16s} {row.get('attn', ''):6s} {row['llvm']:28s} {row['cuda']:10s} "
              f"{row.get('kernels', '')}", flush=True)
        for line in row.get("left", []):
            print(f"{'':16s} {line[:200]}")
        bad += any(row[k].startswith(("WRONG", "failed")) or " / WRONG" in row[k]
                   or " / failed" in row[k] for k in ("llvm", "cuda"))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
