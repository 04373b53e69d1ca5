"""The key's answers for notebooks 07 (beyond one machine) and 08 (your model).

Public: ANSWERS (this part's answer functions, in notebook order). Nothing here launches processes or trains:
07's answers come from the recipes' scales (fp8lab.nn.tokens_per_scale) and the FP8 all-gather simulated in
one process (fp8lab.training.sharding); 08's from fp8lab.inspect on one batch and the cost tables
(fp8lab.training.cost). The runs notebook 07 and 08 make are checked where they run (tests/notebook_checks.py).
"""

from __future__ import annotations

import functools

import torch

from fp8lab.harness.answers.base import Answer, decibels
from fp8lab.lab.predictions import percent, token_spans
from fp8lab.training import capstone
from fp8lab.training.cost import cost_table, per_tensor_vs_block
from fp8lab.training.readiness import inspect
from fp8lab.training.sharding import all_gather_table

__all__ = ["ANSWERS"]


def _q07_ranks() -> Answer:
    spans = token_spans()
    fprop_all = [r for r, s in spans.items() if s["fprop input"] is None]
    later = [r for r, s in spans.items() if s["fprop input"] is not None and None in s.values()]
    never = [r for r, s in spans.items() if None not in s.values()]
    block = spans["blockwise"]["wgrad input"]
    return Answer(
        "07_beyond_one_machine",
        "(1) Without the all-reduce, which recipes' two-process runs differ from one process at step 0, and why "
        "exactly those?",
        "(1) Step 0's loss comes from the forward GEMMs alone, and a rank's scale differs from the one process's "
        "only where one scale covers tokens of both ranks: " + ", ".join(fprop_all) + " scale the forward input "
        "over all tokens (nvfp4 through its fp32 tensor scale), so they differ at step 0; " + ", ".join(later) +
        "'s forward scales cover one token each, but its weight-gradient GEMM scales each channel over all tokens: "
        "it differs from step 1 on; " + ", ".join(never) + " never do (every block lies within one rank's tokens). "
        "The per-rank runs are not wrong: each rank's GEMMs read only its own slice, and its scales are the ones a "
        "single process would take for that slice: the same training, rounded differently. "
        "fp8lab's amax_all_reduce reduces the scales whose tile covers all tokens (per tensor, per channel); "
        "nvfp4's tensor scale is not among them. "
        f"(2) A multiple of {block}: blockwise's weight-gradient tiles cover {block} tokens "
        f"(mxfp8's {spans['mxfp8']['wgrad input']}), its forward tiles one.",
        {"tensorwise and delayed scale the forward input over all tokens": {"tensorwise", "delayed"} <= set(fprop_all),
         "rowwise's forward scales cover one token, its weight-gradient scales all of them": "rowwise" in later,
         "blockwise and mxfp8 need no reduction": {"blockwise", "mxfp8"} <= set(never),
         "blockwise's weight-gradient tiles cover 128 tokens": block == 128},
    )


def _q07_gather() -> Answer:
    t = all_gather_table()
    own = t[(t.amax == "each rank's own") & (t.ranks > 1)]
    agreed = t[t.amax == "all-reduced"]
    return Answer(
        "07_beyond_one_machine",
        "Without the agreed amax, how many scales does the gathered weight carry, and what does reading it with one "
        "scale cost? With it?",
        "Without it, one scale per rank (" + ", ".join(f"{n} for {n} ranks" for n in own.ranks) + "): the gathered "
        "codes are not the ones one process would cast, and read with one scale (rank 0's) the weight is off by " +
        ", "
        "".join(f"{percent(e)}" for e in own["relative error, one scale"]) + " (relative error). With the all-reduced "
        "amax every rank casts with the one scale a single process would use: the gathered codes are that "
        "process's, code for code, and the error is E4M3's rounding alone "
        f"({percent(agreed['relative error, one scale'].max())}). One number per weight is enough because a "
        "per-tensor scale depends only on the amax, and the amax of the whole weight is the largest of its "
        "shards' amaxes: an all-reduce (max) of one float per weight.",
        {"without the agreed amax the shards carry one scale per rank": bool((own["distinct scales"] == own.ranks)
                                                                            .all()),
         "without it the gathered codes differ from one process's": not own["codes as one process casts them"].any(),
         "with it the gathered codes are one process's, code for code":
             bool(agreed["codes as one process casts them"].all()),
         "read with one scale, the per-rank cast is over 10x further off than the agreed one":
             float(own["relative error, one scale"].min()) > 10 * float(agreed["relative error, one scale"].max())},
    )


@functools.cache
def _llm_report(batch_seed: int = 0):
    llm = capstone.make_case("llm_like")
    x, y = llm.batch(torch.Generator().manual_seed(batch_seed))
    return inspect(llm.make_model(), x, llm.loss_fn(y), progress=False)


def _down_input(report) -> dict:
    f = report.frame
    row = f[(f.layer == "blocks.0.down") & (f.gemm == "fprop") & (f.operand == "input") & (f.recipe == "tensorwise")]
    return row.iloc[0].to_dict()


def _q08_dashboard() -> Answer:
    d = _down_input(_llm_report())
    return Answer(
        "08_your_model",
        "The report flags the `down` layers long before any training. Compare the whole-tensor SQNR of "
        "`blocks.0.down`'s fprop input under tensorwise with its ordinary-channel SQNR and its underflow",
        f"blocks.0.down's fprop input under tensorwise: whole-tensor SQNR {decibels(d['sqnr_db'])} dB, "
        f"ordinary-channel SQNR {decibels(d['sqnr_ordinary_db'])} dB, underflow {percent(d['underflow'])}. The "
        "whole-tensor SQNR is decided by the sink channels' energy and looks healthy; the other two show that "
        "nearly everything else flushed to zero. On a dashboard: the underflow (cheap to count, per layer, every "
        "step), or the ordinary-channel SQNR; not the whole-tensor SQNR.",
        {"the whole-tensor SQNR looks healthy (above 20 dB)": d["sqnr_db"] > 20,
         "the ordinary-channel SQNR is below 10 dB": d["sqnr_ordinary_db"] < 10,
         "over half of the operand flushes to zero": d["underflow"] > 0.5},
    )


def _q08_carry() -> Answer:
    a, b = (_down_input(_llm_report(s))["underflow"] for s in (0, 1))
    return Answer(
        "08_your_model",
        "These are small models trained for a few dozen steps. Which of these conclusions would you expect to "
        "carry over to your model, and which would you re-measure",
        "What inspect measures is a property of one forward and backward pass: which layers have outlier channels "
        "and what each recipe flushes there. It does not depend on the run's length and barely on the batch "
        f"(blocks.0.down's flushed share under tensorwise: {percent(a)} on one batch, {percent(b)} on another); "
        "measure it on your model, it carries over as a method. The loss gaps do not: they rest on 60 steps of "
        "seed 0 (150 for the digits), on toy sizes, against a 1% budget. Re-measure them at scale, for longer, on "
        "more than one seed, before you trust a \"fails\" or a \"suits\"; and the modality verdict (images vs text) "
        "is about these three models only.",
        {"the flushed share of blocks.0.down's input is the same on two batches (within 1 point)": abs(a - b) < 0.01},
    )


def _q08_cost() -> Answer:
    one = cost_table(k=4096)
    dp = cost_table(k=4096, parallel="data parallel")
    fsdp = cost_table(k=4096, parallel="FSDP: FP8 all-gather of weights")
    cmp = per_tensor_vs_block(one)
    speed = {a: (cmp.loc[a, "tensorwise"], cmp.loc[a, "blockwise"]) for a in cmp.index if a.startswith("published")}
    mt, mb = int(one.loc["tensorwise", "scale multiplies per output"]), int(one.loc["blockwise",
                                                                                  "scale multiplies per output"])
    return Answer(
        "08_your_model",
        "The published speed-ups favour per-tensor scaling; the amax does not. Where in a training step does "
        "each cost land",
        f"The scale multiplies land in the GEMM: per tensor {mt} per output element, in the epilogue after the "
        f"sum; per 1x128 block {mb} at K=4096, inside the main loop. "
        "The amax lands in a kernel before the GEMM: current per-tensor scaling reads the whole tensor once for "
        "the amax and again to cast it; a block's amax is found as the block is read. The network: under data "
        "parallelism nothing (each rank scales its own tensors); where ranks gather an FP8 tensor (FSDP's FP8 "
        "all-gather of weights, sequence parallelism) an all-reduce of one amax per per-tensor-scaled tensor. "
        "Published, GEMM plus quantization over BF16 (TransformerEngine): " +
        "; ".join(f"{a.split(', ')[-1].split(' (')[0]} tensorwise {t} vs {b}" for a, (t, b) in speed.items()) + ".",
        {"per tensor: one scale multiply per output; per 1x128 block at K=4096: 32": (mt, mb) == (1, 32),
         "current per-tensor scaling reads the tensor twice": "read twice" in one.loc["tensorwise", "amax"],
         "data parallelism needs no amax all-reduce": "nothing to agree on" in dp.loc["tensorwise", "amax"],
         "an FP8 all-gather of per-tensor weights needs one": "all-reduce" in fsdp.loc["tensorwise", "amax"]},
    )


ANSWERS = (_q07_ranks, _q07_gather, _q08_dashboard, _q08_carry, _q08_cost)
