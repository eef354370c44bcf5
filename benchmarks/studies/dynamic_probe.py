"""Where symbolic shapes break today (issue 48): models exported with dynamic dims, step by step.

    python benchmarks/studies/dynamic_probe.py [--only NAME ...]

For each case — an attention block written in PyTorch, and the zoo's Hugging Face models at tiny
sizes, with a dynamic sequence length (and batch) — the study runs the path a dynamic
``from_torch`` would take and prints what each step gives:

1. ``torch.export`` with ``dynamic_shapes`` (PyTorch's ``Dim``);
2. TVM's ``from_exported_program`` (with the frontend's decompositions);
3. the stitch pipeline and TVM's default one on ``llvm``: built once, run at three lengths
   against PyTorch in float32;
4. on CUDA (sm_90a, built on this machine): the fusion report of each pipeline (kernels, and
   how many the stitch passes analysed), beside the stitch report of the same model exported
   static at one length.

Nothing is timed; no GPU is needed.
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np


def _attention_block():
    import torch

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(64, 192)
            self.out = torch.nn.Linear(64, 64)
            self.norm = torch.nn.LayerNorm(64)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.proj(x).view(b, s, 3, 2, 32).permute(2, 0, 3, 1, 4)
            a = torch.softmax(q @ k.transpose(-1, -2) * 32**-0.5, dim=-1) @ v
            return self.norm(self.out(a.transpose(1, 2).reshape(b, s, 64)) + x)

    torch.manual_seed(0)
    return Block().eval()


def _without_cache(model):
    import torch

    class NoCache(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, input_ids):
            return self.model(input_ids, use_cache=False).last_hidden_state

    return NoCache().eval()


def _cases():
    import torch
    from torch.export import Dim

    from tvm_stitch.workloads.zoo import MODELS, make_model

    batch, seq = Dim("batch", min=2, max=64), Dim("seq", min=2, max=512)

    def block():
        return _attention_block(), lambda b, s: ((torch.randn(b, s, 64),), {}), \
            {"x": {0: batch, 1: seq}}

    def zoo(name, mask):
        if name == "hf-bert":
            import transformers

            torch.manual_seed(0)
            model = transformers.BertModel(transformers.BertConfig(
                hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                intermediate_size=256, vocab_size=500, attn_implementation="eager")).eval()
        else:  # a decoder without its KV cache (a cache object is no exported output)
            model = _without_cache(make_model(MODELS[name], "tiny"))

        def inputs(b, s):
            ids = torch.randint(0, 100, (b, s))
            kwargs = {"attention_mask": torch.ones(b, s, dtype=torch.long)} if mask else {}
            return (ids,), kwargs

        shapes = {"input_ids": {0: batch, 1: seq}}
        if mask:
            shapes["attention_mask"] = {0: batch, 1: seq}
        return model, inputs, shapes

    return {
        "attention-block": block,
        "hf-bert-tiny": lambda: zoo("hf-bert", True),
        "gpt2-tiny": lambda: zoo("gpt2", False),
        "llama-tiny": lambda: zoo("llama", False),
    }


def _step(record, name, fn):
    start = time.perf_counter()
    try:
        out = fn()
        record[name] = "ok"
        return out
    except Exception as err:  # noqa: BLE001 - the study reports every failure and goes on
        from tvm_stitch.errors import error_line

        record[name] = f"{type(err).__name__}: {error_line(err, 'no message')}"[:300]
        return None
    finally:
        record[f"{name}_s"] = round(time.perf_counter() - start, 1)


def _report(mod, target, pipeline):
    import tvm_stitch

    report = tvm_stitch.fusion_report(mod, target, pipeline=pipeline)
    kinds = [k for g in report.groups for k in g.kinds]
    return {"kernels": report.kernels,
            "unanalysed": sum(k == "unanalysed" for k in kinds)}


def probe(name: str, make) -> dict:
    import torch
    import tvm
    from tvm import relax
    from tvm.relax.frontend import detach_params
    from tvm.relax.frontend.torch import from_exported_program

    import tvm_stitch
    from tvm_stitch.frontend import decompositions

    record = {"case": name}
    model, inputs, shapes = make()
    args, kwargs = inputs(2, 17)

    def export(dynamic):
        with torch.no_grad():
            return torch.export.export(model, args, kwargs=kwargs,
                                       dynamic_shapes=shapes if dynamic else None)

    def imported(exported):
        mod = from_exported_program(exported.run_decompositions(decompositions()),
                                    keep_params_as_input=True, unwrap_unit_return_tuple=True,
                                    run_ep_decomposition=False)
        return detach_params(mod)

    exported = _step(record, "export", lambda: export(True))
    if exported is None:
        return record
    pair = _step(record, "import", lambda: imported(exported))
    if pair is None:
        return record
    mod, params = pair
    weights = [tvm.runtime.tensor(p.numpy()) for p in params["main"]]
    record["signature"] = ", ".join(str(p.ty) for p in mod["main"].params[:-len(weights) or None])

    for pipeline in ("stitch", "default"):
        def run(pipeline=pipeline):
            relax_pipeline = tvm_stitch.pipeline("llvm") if pipeline == "stitch" else None
            ex = tvm.compile(mod, "llvm", relax_pipeline=relax_pipeline)
            vm = relax.VirtualMachine(ex, tvm.cpu())
            errors = {}
            for b, s in ((2, 5), (3, 17), (2, 40)):
                a, kw = inputs(b, s)
                with torch.no_grad():
                    want = model(*a, **kw)
                want = want[0] if isinstance(want, tuple) else getattr(
                    want, "last_hidden_state", want)
                got = vm["main"](*[tvm.runtime.tensor(t.numpy()) for t in (*a, *kw.values())],
                                 *weights)
                got = got[0] if type(got).__name__ in ("Array", "list", "tuple") else got
                errors[f"{b}x{s}"] = float(np.abs(got.numpy() - want.numpy()).max())
            return errors

        record[f"llvm_{pipeline}_err"] = _step(record, f"llvm_{pipeline}", run)

    cuda = tvm.target.Target({"kind": "cuda", "arch": "sm_90a"})
    for pipeline in ("stitch", "default"):
        record[f"cuda_{pipeline}"] = _step(record, f"cuda_{pipeline}_report",
                                           lambda p=pipeline: _report(mod, cuda, p))
    static = _step(record, "static_import", lambda: imported(export(False))[0])
    if static is not None:
        record["cuda_stitch_static_2x17"] = _step(record, "static_report",
                                                  lambda: _report(static, cuda, "stitch"))
    return record


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None)
    args = parser.parse_args(argv)
    cases = _cases()
    for name in args.only or list(cases):
        print(json.dumps(probe(name, cases[name])), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
