"""FP8 training: the layers, the toy models, the training step, and what is built on them.

  layers.py       FP8Linear (three FP8 GEMMs per linear layer), layer_gemms (public as fp8lab.nn)
  armour.py       what lets FP8Linear stand in for nn.Linear: autocast, torch.func refusals, empty batches,
                  state_dict histories, FP8 subclasses of other linear classes
  monitor.py      Monitor: per layer, GEMM and operand, what each quantization did in training (fp8lab.nn)
  delayed.py      delayed scaling in a training loop: one history entry per optimizer step, recompute-safe
  attention.py    MultiheadAttention with its projections routed (FP8, or inspect's recorder)
  convert.py      convert(model, recipe): every linear GEMM site FP8 or named; unwrap; the report
  capture.py      inspect's capture: every site's operands in one high-precision pass (or several)
  gpu_support.py  which GEMMs of each recipe run real on which GPU generation, and why
  models.py       the toy MLP and transformer with sink channels, their tasks
  train.py        train (recipes side by side), train_step, notebook 06's settings and sweeps
  shipped.py      reads the shipped runs' data files, runs/*.json (one table each; fp8lab.harness writes them)
  lesson.py       notebook 06's lesson MLP at its fixed inputs, and the loss of predicting the mean
  measured.py     the training runs shipped with the lab (the sink cliff, delayed recovery, rowwise's mismatch)
  published.py    LLM outlier ratios as papers publish them (data: sources/published.json), placed on the
                  lesson's cliff; what flushing costs
  operands.py     one activation as the forward and the weight-gradient GEMM quantize it; why rowwise fails
  sharding.py     an FP8 all-gather of a sharded tensor: where ranks must agree on one amax
  distributed.py  FSDP2 under torchrun on the CPU: the run, its worker and its command line
  torchrun.py     launching and watching torchrun's processes; watchdog.py ends a run whose launcher died
  readiness.py    fp8lab.inspect: any model's FP8 readiness, per layer
  export.py       a recipe written for torchao, TransformerEngine, torchtitan
  cost.py         what each recipe costs: scale storage, amax, scale multiplies
  capstone.py     notebook 08's three models and the article's claims tested
  gradients.py    dy over a high-precision run, and what each FP8 choice for it keeps (notebook 09)
  parts.py        the NVFP4 training recipe's parts trained on the toys, judged as trained and in high precision
  measured_fp4.py notebook 09's shipped runs (the parts, the choices for dy, the backward pass alone)
  fp4_effects.py  each backward part at work: stochastic rounding in a sum, the transform by contrast, depth
Notebooks 06-09 introduce them.
"""
