"""The backend: the one place a GEMM is sent to torch's scaled matmul or to the emulation.

Public: matmul(a, b, recipe, backend) (a[M, K] @ b[K, N], both operands quantized as the recipe
says), GemmBackend (decides per pair of operands, probes each kernel family once, counts every
decision with its reason), default_backend, resolve_backend, BackendChoice, agrees_with_emulation,
BACKENDS. Notebook 05 calls matmul; notebook 00 and `python -m fp8lab doctor` show the choices.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from functools import lru_cache

import torch

from fp8lab.gemm.accumulation import AccumulatorModel
from fp8lab.gemm.emulation import EMULATIONS, check_matmul_shapes, emulated_mm, quantize_operands
from fp8lab.gemm.real import (
    Arch,
    KernelPlan,
    KernelUnavailable,
    check_fast_accum,
    pair_kind,
    plan_gemm,
    prepare_real_mm,
    resolve_target,
    sm_name,
)
from fp8lab.numerics.quantize import QuantizedTensor, quantize
from fp8lab.numerics.recipes import Recipe, get_recipe

__all__ = [
    "BACKENDS",
    "BackendChoice",
    "GemmBackend",
    "agrees_with_emulation",
    "default_backend",
    "matmul",
    "resolve_backend",
]

BACKENDS: tuple[str, ...] = ("auto", "emulated", "scaled_mm")


# ---- one decision per GEMM: real or emulated, counted ------------------------------------------------------------


@dataclass(frozen=True)
class BackendChoice:
    """Which backend runs a GEMM, and why. plan is set where the real kernel runs."""

    backend: str  # "scaled_mm" or "emulated"
    kernel: str  # e.g. "scaled_mm BlockWise1x128 x BlockWise128x128", "emulated fast (bf16 math)"
    reason: str
    plan: KernelPlan | None = None

    def __str__(self) -> str:
        return self.reason


EMULATED_KERNEL = "emulated fast (fp32)"


@lru_cache(maxsize=1)
def _cpu_choice() -> BackendChoice:
    why = "the operands are on the CPU" if torch.cuda.is_available() else "no CUDA device"
    return BackendChoice("emulated", EMULATED_KERNEL, f"emulated: {why}")


def _probe_operand(q: QuantizedTensor, rows: int, k: int, g: torch.Generator, device: torch.device,
                   magnitude: float = 1.0) -> QuantizedTensor:
    """A small operand quantized as q is (its format, blocks, scale rule and scale format, tensor
    scale): what the kernel planned for q runs on in the probe."""
    x = torch.randn(rows, k, generator=g, device="cpu") * magnitude
    return quantize(x.to(device), q.fmt, q.granularity, q.scale_rule, q.margin, scale_fmt=q.scale_fmt,
                    two_level=q.tensor_scale is not None)


class GemmBackend:
    """The one place a GEMM is sent to torch's scaled matmul or to the emulation.

    mode: "auto" (real where the GPU has the kernel for the two operands, else emulated),
          "emulated" (always), "scaled_mm" (real or KernelUnavailable).
    arch, cuda: None reads them from the operands' device and torch.version.cuda; set, they
          make the real path act as that GPU generation would (tests run torch's functions
          replaced by a stand-in with torch's checks, on CPU tensors).
    probe: before a kernel's first real use on a device, run it once on a small problem and
          compare with the emulation. What is probed is what was planned (KernelPlan: the
          family, both operands' formats, the output dtype, NVFP4's tensor scales), on operands
          quantized as the pair is; a plan whose probe fails is emulated, with the probe's reason.
          A plan that passed is never switched off: a later failure falls back to the emulation
          for that call only, and is counted and reported once.
    Every decision is counted per (layer, gemm, kernel, backend, reason): report() and summary().
    """

    def __init__(self, mode: str = "auto", arch: Arch | None = None, cuda: str | None = None,
                 probe: bool = True, verbose: bool = True) -> None:
        if mode not in BACKENDS:
            raise ValueError(f"unknown backend {mode!r}; valid: {', '.join(BACKENDS)}")
        if arch is not None and not (isinstance(arch, tuple) and len(arch) == 2
                                     and all(isinstance(v, int) for v in arch)):
            raise ValueError(f"arch is a compute capability like (9, 0), got {arch!r}")
        self.mode, self.arch, self.cuda, self.probe, self.verbose = mode, arch, cuda, probe, verbose
        self.probes: dict[tuple[str, str], tuple[bool, str]] = {}
        self.counts: dict[tuple[str, str, str, str, str], int] = {}
        self._announced: set[tuple] = set()

    def __repr__(self) -> str:
        where = f", simulating {sm_name(self.arch)} CUDA {self.cuda}" if self.arch is not None else ""
        return f"GemmBackend({self.mode}{where})"

    def fresh(self) -> GemmBackend:
        """A backend that decides alike (same mode, target, probe results) with counts of its own."""
        other = GemmBackend(self.mode, self.arch, self.cuda, self.probe, self.verbose)
        other.probes = self.probes
        return other

    def __deepcopy__(self, memo: dict) -> GemmBackend:
        return self  # a backend is the process's (or a test's) decision, shared by every copy of a model

    def __reduce__(self):
        # a saved model (torch.save) reloads with the process's default backend for its mode, or a
        # backend deciding alike; probes and counts belong to the process that made them
        if _DEFAULT_BACKENDS.get(self.mode) is self:
            return (default_backend, (self.mode,))
        return (GemmBackend, (self.mode, self.arch, self.cuda, self.probe, self.verbose))

    # ---- the decision ----
    def choose(self, a_q: QuantizedTensor, b_q: QuantizedTensor) -> BackendChoice:
        """Real or emulated for this pair, and why (probing the kernel family once on a GPU)."""
        if self.mode == "emulated":
            return BackendChoice("emulated", EMULATED_KERNEL, "emulated: asked for")
        if self.arch is None and a_q.data.device.type != "cuda" and self.mode == "auto":
            return _cpu_choice()  # the common case on a laptop, answered without building a plan
        try:
            arch, cuda, device = resolve_target(a_q, self.arch, self.cuda)
            plan = plan_gemm(a_q, b_q, arch, cuda)
            if self.probe and device.type == "cuda":
                ok, why = self._probe(plan, device, a_q, b_q, cuda)
                if not ok:
                    raise KernelUnavailable(why)
        except KernelUnavailable as err:
            if self.mode == "scaled_mm":
                raise
            return BackendChoice("emulated", EMULATED_KERNEL, f"emulated: {err}")
        return BackendChoice("scaled_mm", f"scaled_mm {plan.kind}", f"real: scaled_mm {plan.label}", plan)

    def _probe(self, plan: KernelPlan, device: torch.device, a_q: QuantizedTensor, b_q: QuantizedTensor,
               cuda: str | None) -> tuple[bool, str]:
        """Run `plan` once on small operands quantized as a_q and b_q are, against the emulation."""
        key = (str(device), plan)
        if key not in self.probes:
            g = torch.Generator().manual_seed(0)
            pa, pb = _probe_operand(a_q, 96, 384, g, device), _probe_operand(b_q, 80, 384, g, device, 3.0)
            try:
                if plan_gemm(pa, pb, plan.arch, cuda) != plan:
                    raise KernelUnavailable(f"the probe's operands plan {plan_gemm(pa, pb, plan.arch, cuda).label}")
                got = prepare_real_mm(pa, pb, plan, device).result().double().cpu()
            except Exception as exc:  # a kernel that fails its probe is emulated, with the reason
                self.probes[key] = (False, f"{plan.label} failed its probe: {type(exc).__name__}: "
                                           f"{str(exc).splitlines()[0][:160]}")
            else:
                ok, worst = agrees_with_emulation(got, pa, pb, plan.out_dtype)
                self.probes[key] = (ok, "probe ok" if ok else
                                    f"{plan.label} disagreed with the emulation in its probe (worst {worst:.2g})")
        return self.probes[key]

    # ---- running ----
    def mm(self, a_q: QuantizedTensor, b_q: QuantizedTensor, *, layer: str = "", gemm: str = "matmul",
           use_fast_accum: bool = False, out_device: torch.device | None = None) -> torch.Tensor:
        """a_q @ b_q.T as float32, real or emulated as choose() says; counts the decision.
        use_fast_accum=True is for the kernels that take it (FAST_ACCUM_KINDS): ValueError for a
        pair whose kernel refuses or ignores it, on any machine."""
        if use_fast_accum:
            with contextlib.suppress(KernelUnavailable):  # (no kernel at all: the emulation runs anyway)
                check_fast_accum(pair_kind(a_q, b_q))
        choice = self.choose(a_q, b_q)
        if choice.plan is not None:
            device = resolve_target(a_q, self.arch, self.cuda)[2]
            try:
                out = prepare_real_mm(a_q, b_q, choice.plan, device, use_fast_accum).result().float()
            except Exception as exc:  # never stop a workshop: emulate this call, count it, say why once
                if self.mode == "scaled_mm":
                    raise
                reason = f"emulated: scaled_mm {choice.plan.kind} failed ({type(exc).__name__}: " \
                         f"{str(exc).splitlines()[0][:160]})"
                self._count(layer, gemm, choice.kernel, "fallback", reason)
                self._say(("fallback", choice.plan.kind, reason), f"fp8lab: {layer or gemm}: {reason}")
            else:
                self._count(layer, gemm, choice.kernel, "scaled_mm", choice.reason)
                return out if out_device is None else out.to(out_device)
        else:
            self._count(layer, gemm, choice.kernel, "emulated", choice.reason)
        out = emulated_mm(a_q, b_q)
        return out if out_device is None else out.to(out_device)

    def _count(self, layer: str, gemm: str, kernel: str, backend: str, reason: str) -> None:
        key = (layer, gemm, kernel, backend, reason)
        self.counts[key] = self.counts.get(key, 0) + 1

    def _say(self, key: tuple, line: str) -> None:
        if key not in self._announced:
            self._announced.add(key)
            if self.verbose:
                print(line)

    def fallbacks(self) -> int:
        """GEMMs that were planned real, failed at run time and were emulated instead."""
        return sum(c for k, c in self.counts.items() if k[3] == "fallback")

    def report(self) -> list[dict]:
        """One row per (layer, gemm, kernel, backend, reason) with its number of calls."""
        cols = ("layer", "gemm", "kernel", "backend", "reason")
        return [{**dict(zip(cols, k, strict=True)), "calls": c} for k, c in self.counts.items()]

    def summary(self) -> str:
        """Which backend each GEMM used, one line per (gemm, backend, reason), layers pooled."""
        pooled: dict[tuple[str, str, str], int] = {}
        for (_, gemm, _, backend, reason), c in self.counts.items():
            pooled[(gemm, backend, reason)] = pooled.get((gemm, backend, reason), 0) + c
        if not pooled:
            return "no FP8 GEMMs ran"
        return "\n".join(f"{gemm:>6}: {c} calls {backend}: {reason.split(': ', 1)[-1]}"
                         for (gemm, backend, reason), c in sorted(pooled.items()))

    def reset(self) -> None:
        self.counts.clear()


def agrees_with_emulation(real: torch.Tensor, a_q: QuantizedTensor, b_q: QuantizedTensor,
                          out_dtype: torch.dtype) -> tuple[bool, float]:
    """The real kernel's a @ b.T against the exact emulation, at the precision of its output.

    float32 outputs: within 2^-12 * (|a| @ |b|.T). bfloat16 outputs: within one bf16 ulp of the
    emulation rounded to bf16, plus what fp32 accumulation may differ by where a sum cancels
    (the kernel and the emulation each within gamma_K * (|a| @ |b|.T), gamma_K = K u / (1 - K u),
    u = 2^-24: Higham's bound; negligible unless the output is far smaller than |a| @ |b|).
    Returns (ok, worst ratio of the difference to what is allowed)."""
    a_q, b_q = a_q.to("cpu"), b_q.to("cpu")
    emu = emulated_mm(a_q, b_q).double()
    got = real.double().cpu()
    magnitude = a_q.dequantize().double().abs() @ b_q.dequantize().double().abs().t()
    if out_dtype == torch.bfloat16:
        ref = emu.to(torch.bfloat16).double()
        _, e = torch.frexp(ref.abs().clamp(min=2.0**-133))
        k = a_q.shape[1] + 4
        gamma = k * 2.0**-24 / (1 - k * 2.0**-24)
        allowed = torch.ldexp(torch.ones_like(ref), e - 8) + 2 * gamma * magnitude  # one bf16 ulp at ref
    else:
        allowed = 2.0**-12 * magnitude + 2.0**-149
        ref = emu
    diff = (got - ref).abs()
    worst = float((diff / allowed).max()) if diff.numel() else 0.0
    return bool((diff <= allowed).all()), worst


_DEFAULT_BACKENDS: dict[str, GemmBackend] = {}


def default_backend(mode: str = "auto") -> GemmBackend:
    """The process's GemmBackend for `mode` (made once; matmul and FP8Linear use it unless given one)."""
    if isinstance(mode, GemmBackend):
        return mode
    if mode not in BACKENDS:
        raise ValueError(f"unknown backend {mode!r}; valid: {', '.join(BACKENDS)}, or a GemmBackend")
    if mode not in _DEFAULT_BACKENDS:
        _DEFAULT_BACKENDS[mode] = GemmBackend(mode)
    return _DEFAULT_BACKENDS[mode]


def resolve_backend(recipe: Recipe | str = "tensorwise", device: torch.device | str | None = None,
                    backend: str | GemmBackend = "auto", probe: bool = True) -> BackendChoice:
    """What fp8lab.matmul(a, b, recipe) would run on `device` (its fprop pair: the recipe's input and weight)."""
    recipe = get_recipe(recipe)
    engine = default_backend(backend) if probe else GemmBackend(backend if isinstance(backend, str) else backend.mode,
                                                                  probe=False)
    if device is None:
        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    g = torch.Generator().manual_seed(0)
    a, b = (torch.randn(*shape, generator=g, dtype=torch.float32, device="cpu") for shape in ((32, 256), (256, 32)))
    a_q, b_q = quantize_operands(a.to(device), b.to(device), recipe)
    return engine.choose(a_q, b_q)


# ---- matmul ---------------------------------------------------------------------------------------------------


def matmul(
    a: torch.Tensor | QuantizedTensor,
    b: torch.Tensor | QuantizedTensor,
    recipe: Recipe | str = "tensorwise",
    backend: str | GemmBackend = "auto",
    *,
    emulation: str = "fast",
    accumulation: AccumulatorModel | None = None,
    use_fast_accum: bool = False,
    verbose: bool = True,
) -> torch.Tensor:
    """a[M, K] @ b[K, N] with both operands quantized as `recipe` says; returns float32 [M, N].

    a and b may be tensors (quantized here: a as the recipe's input, b as its weight in
    b^T[N, K] layout) or QuantizedTensors (a_q[M, K]; b_q[N, K], i.e. quantize(b.t())).
    backend "auto" runs torch's scaled matmul where the GPU has the kernel for the two
    operands and emulates otherwise (a GemmBackend may be passed instead of a mode); the
    choice and its reason are printed the first time per (device, kernel, shapes). A kernel
    that fails at run time falls back to emulation for that call, counted, with the reason.
    The real kernels' bf16 outputs (MX, NVFP4) are returned as float32. An operand with no
    elements (M, N or K of 0) gives zeros [M, N], as torch.matmul does. use_fast_accum=True asks
    the tensorwise and rowwise kernels for their fast accumulation (ValueError for other pairs).
    """
    if emulation not in EMULATIONS:
        raise ValueError(f"unknown emulation {emulation!r}; valid: {', '.join(EMULATIONS)}")
    engine = default_backend(backend)
    recipe = get_recipe(recipe)
    if isinstance(a, QuantizedTensor) != isinstance(b, QuantizedTensor):
        raise TypeError("pass both operands as tensors, or both as QuantizedTensors")
    if isinstance(a, QuantizedTensor):
        a_q, b_q = a, b
        home = a.data.device
    else:
        home = a.device
        check_matmul_shapes(a, b)
        if a.numel() == 0 or b.numel() == 0:  # (M, N or K of 0: nothing to quantize, as torch.matmul)
            return torch.zeros(a.shape[0], b.shape[1], device=home)
        a_q, b_q = quantize_operands(a.detach(), b.detach(), recipe)
    if a_q.shape[1] != b_q.shape[1]:
        raise ValueError(
            f"operands must share K: a_q is {tuple(a_q.shape)} (M, K), b_q is {tuple(b_q.shape)} (N, K); "
            "quantize b as b.t() (its [N, K] layout), e.g. with fp8lab.gemm.quantize_operands")
    if accumulation is not None and engine.mode == "scaled_mm":
        raise ValueError("the accumulation model is an emulation; use backend='emulated' or 'auto'")
    if accumulation is not None or emulation == "reference":
        if verbose:
            engine._say(("emulated", recipe.name, tuple(a_q.shape), tuple(b_q.shape), emulation),
                        f"fp8lab.matmul {recipe.name}: emulated ({emulation}"
                        f"{', ' + accumulation.label if accumulation else ''})")
        return emulated_mm(a_q, b_q, emulation=emulation, accumulation=accumulation)
    # CPU tensors on a machine with a GPU still get the real kernel: the same notebook cell
    # runs real FP8 on a GPU box and emulates on a laptop
    if home.type != "cuda" and torch.cuda.is_available() and engine.arch is None and engine.mode != "emulated":
        a_q, b_q = a_q.to("cuda"), b_q.to("cuda")
    if verbose:
        choice = engine.choose(a_q, b_q)
        m, k = a_q.shape
        engine._say((str(a_q.data.device), choice.kernel, tuple(a_q.shape), tuple(b_q.shape)),
                    f"fp8lab.matmul {recipe.name} [{m}x{k}] @ [{k}x{b_q.shape[0]}]: {choice}")
    return engine.mm(a_q, b_q, gemm="matmul", use_fast_accum=use_fast_accum, out_device=home)
