"""convert(model, recipe): every linear GEMM of any torch model in FP8, or named with the reason it is not.

Public: convert, unwrap, fp8_layers, find_sites, conversion_report, ConversionReport, Site, ENGINES.
A site is one place a model runs linear GEMMs: a module that is an nn.Linear in behaviour (nn.Linear,
a subclass without a forward of its own such as attention's out_proj, a parametrized or a lazy one)
or a MultiheadAttention's in-projection. convert makes each FP8 in place (the module's class becomes
an FP8 class of its own: hooks, parametrizations, attributes and state-dict keys stay), turns off the
fused evaluation paths of torch's transformer modules that would bypass them, and reports what it
converted, what it kept (asked) and what it left (with the reason; strict=True raises instead).
fp8lab.inspect measures exactly these sites. Notebook 08 converts a model of your own.
"""

from __future__ import annotations

import copy
import fnmatch
import html
import warnings
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from fp8lab.extras import require
from fp8lab.gemm import GemmBackend, default_backend
from fp8lab.numerics.recipes import TORCHAO_RECIPES, Recipe, get_recipe
from fp8lab.training.attention import FAST_PATH_SWITCHES, FP8MultiheadAttention
from fp8lab.training.layers import IDENTITY, AmaxReducer, FP8Linear, base_class, fp8_class
from fp8lab.training.monitor import Monitor

__all__ = ["ENGINES", "IN_PROJ", "LINEAR", "ConversionReport", "ConversionWarning", "Site", "conversion_report",
           "convert", "find_sites", "fp8_layers", "stray_matrices", "unwrap"]

ENGINES = ("fp8lab", "torchao")
LINEAR, IN_PROJ = "linear", "attention in-projection"
_FP8_ATTRIBUTES = ("recipe", "backend", "monitor", "layer_name", "amax_reducer", "calls", "delayed")
_REPORT = "fp8lab_conversion"  # the attribute of a converted model that holds its ConversionReport


class ConversionWarning(UserWarning):
    """convert left a linear GEMM of the model in high precision without being asked to, or a recipe's
    high-precision share (rounded up) kept every one."""


@dataclass(frozen=True)
class Site:
    """A place where the model runs a linear GEMM: `module` is the linear layer itself (kind "linear")
    or the nn.MultiheadAttention whose in-projection this is (kind "attention in-projection"; name
    "<attention>.in_proj")."""

    name: str
    kind: str
    module: nn.Module

    @property
    def type(self) -> str:
        return type(self.module).__name__ if self.kind == LINEAR else f"{type(self.module).__name__}.in_proj"


def _forward_owner(cls: type) -> type | None:
    return next((c for c in cls.__mro__ if "forward" in c.__dict__), None)


def _linear_in_behaviour(module: nn.Module) -> bool:
    """An nn.Linear whose forward is nn.Linear's (or FP8Linear's): nn.Linear itself, a subclass that adds
    no forward (NonDynamicallyQuantizableLinear), a parametrized or a lazy one."""
    return isinstance(module, nn.Linear) and _forward_owner(type(module)) in (nn.Linear, FP8Linear)


def _attention(module: nn.Module) -> bool:
    return type(module) in (nn.MultiheadAttention, FP8MultiheadAttention)


def find_sites(model: nn.Module) -> tuple[list[Site], list[dict[str, str]], list[dict[str, str]]]:
    """The model's linear GEMM sites in module order; the linear layers that cannot be sites, each with
    the reason (dicts: module, type, reason); and modules whose matmuls are not linear GEMMs (conv,
    bilinear, recurrent), which no FP8 recipe here covers."""
    sites: list[Site] = []
    left: list[dict[str, str]] = []
    other: list[dict[str, str]] = []
    bypassed: dict[str, str] = {}  # out_proj of an attention whose own forward reads its weight
    for name, m in model.named_modules():
        if isinstance(m, nn.MultiheadAttention):
            if _attention(m):
                sites.append(Site(f"{name}.in_proj" if name else "in_proj", IN_PROJ, m))
            else:
                left.append({"module": name, "type": type(m).__name__,
                             "reason": "a subclass of nn.MultiheadAttention: its own forward may apply its "
                                       "projection weights in ways convert cannot follow"})
                bypassed[f"{name}.out_proj" if name else "out_proj"] = name
        if isinstance(m, nn.Linear):
            if name in bypassed:
                left.append({"module": name, "type": type(m).__name__,
                             "reason": f"inside {bypassed[name] or '(model)'}, whose forward reads its weight "
                                       "directly (never calling this module)"})
            elif _linear_in_behaviour(m):
                sites.append(Site(name, LINEAR, m))
            else:
                owner = _forward_owner(type(m))
                left.append({"module": name, "type": type(m).__name__,
                             "reason": f"a subclass of nn.Linear with a forward of its own "
                                       f"({owner.__qualname__ if owner else '?'}.forward): convert cannot know "
                                       "what it computes; build it from an nn.Linear (its extra work outside) to "
                                       "convert it"})
        elif isinstance(m, nn.modules.conv._ConvNd | nn.Bilinear | nn.RNNBase):
            other.append({"module": name, "type": type(m).__name__,
                          "reason": "its matmuls are not nn.Linear GEMMs: they stay in high precision (the "
                                    "recipes here cover linear layers)"})
    return sites, left, other


@dataclass
class ConversionReport:
    """What convert did to each linear GEMM site of a model.

    converted: rows (module, type, kind, recipe); kept: rows (module, type, kind, reason) kept in high
    precision because the call asked (skip, keep_first_last, overrides to None); left: rows (module,
    type, reason) that are linear layers convert cannot make FP8; other: modules with non-linear matmuls;
    fast_paths_off: modules whose fused evaluation path was turned off; notes: everything else to know.
    """

    engine: str
    recipe: str
    converted: list[dict[str, str]] = field(default_factory=list)
    kept: list[dict[str, str]] = field(default_factory=list)
    left: list[dict[str, str]] = field(default_factory=list)
    other: list[dict[str, str]] = field(default_factory=list)
    fast_paths_off: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def frame(self):
        """One row per site and module: module, type, status (converted / kept / left / not linear),
        recipe, reason."""
        import pandas as pd

        rows = [{**r, "status": "converted", "reason": ""} for r in self.converted]
        rows += [{**r, "status": "kept", "recipe": "high precision"} for r in self.kept]
        rows += [{**r, "status": "left", "recipe": "high precision"} for r in self.left]
        rows += [{**r, "status": "not linear", "recipe": "-"} for r in self.other]
        return pd.DataFrame(rows, columns=["module", "type", "status", "recipe", "reason"])

    def __str__(self) -> str:
        lines = [f"convert ({self.engine}, {self.recipe}): {len(self.converted)} site(s) in FP8, {len(self.kept)} "
                 f"kept in high precision as asked, {len(self.left)} left in high precision"
                 + (f"; {len(self.other)} module(s) with other matmuls, in high precision" if self.other else "")]
        lines += [f"  left: {r['module'] or '(model)'} ({r['type']}): {r['reason']}" for r in self.left]
        lines += [f"  kept: {r['module'] or '(model)'}: {r['reason']}" for r in self.kept]
        lines += [f"  not linear: {r['module'] or '(model)'} ({r['type']}): {r['reason']}" for r in self.other]
        if self.fast_paths_off:
            lines.append("  fused evaluation paths off (they bypass the FP8 layers): " + ", ".join(self.fast_paths_off))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    def _repr_html_(self) -> str:
        return "<pre style='white-space:pre-wrap'>" + html.escape(str(self)) + "</pre>"


def conversion_report(model: nn.Module) -> ConversionReport:
    """The ConversionReport of the convert call that made `model`, with a note naming the converted
    sites not called since (a forward that reads a layer's weight directly bypasses the layer)."""
    report = getattr(model, _REPORT, None)
    if report is None:
        raise ValueError("this model was not made by fp8lab.nn.convert (it carries no conversion report)")
    report = copy.copy(report)
    modules = dict(model.named_modules())
    idle = [r["module"] for r in report.converted if _calls(modules.get(_module_of(r["module"], r["kind"])),
                                                          r["kind"]) == 0]
    if idle and len(idle) < len(report.converted):  # (before any forward, every site is idle: nothing to say)
        report.notes = [*report.notes, "not called since convert (a forward that reads a layer's weight directly, "
                        "x @ layer.weight.T, bypasses it; or no forward has run yet): " + ", ".join(idle)]
    return report


def _module_of(site: str, kind: str) -> str:
    """The name of the module a site lives in (an in-projection lives in its attention)."""
    return site.rpartition(".")[0] if kind == IN_PROJ else site


def _calls(module: nn.Module | None, kind: str) -> int | None:
    if module is None:
        return None
    if kind == IN_PROJ:
        proj = getattr(module, "fp8_in_proj", None)
        return proj.calls if proj is not None else None
    return getattr(module, "calls", None)


# ---- convert ------------------------------------------------------------------------------------------------------


def convert(
    model: nn.Module,
    recipe: Recipe | str,
    skip: Iterable[str] | Callable[[str, nn.Module], bool] | None = None,
    keep_first_last: bool = False,
    engine: str = "fp8lab",
    backend: str | GemmBackend = "auto",
    monitor: Monitor | None = None,
    inplace: bool = False,
    amax_reducer: AmaxReducer | None = None,
    overrides: Mapping[str, Recipe | str | None] | None = None,
    strict: bool = False,
) -> nn.Module:
    """Make every linear GEMM site of `model` FP8 (find_sites); returns the converted model.

    recipe: the recipe of every site (a Recipe or its name).
    skip: site names to keep in high precision (or a predicate (name, module) -> keep).
    keep_first_last: keep the first and last site in high precision. fp8lab's shortcut for one common choice, no
        paper's rule: TransformerEngine's distributed test script has the same switch, "--first-last-layers-bf16"
        ("Use bf16 for first and last N layers.", tests/pytorch/distributed/run_layer_with_overlap.py, with
        --num-layers-at-start-in-bf16 and --num-layers-at-end-in-bf16); the NVFP4 pretraining paper's layers are
        mostly the last ones (Recipe.high_precision_share).
    overrides: {site name or glob pattern: recipe, or None for high precision}: per-site recipes (the
        first pattern that matches a site wins; a pattern matching no site is an error).
    engine: "fp8lab" (FP8Linear and FP8MultiheadAttention, every recipe, emulated or real) or "torchao"
        (torchao.float8.convert_to_float8_training: tensorwise, rowwise, rowwise_with_gw_hp; emulate=True
        on the CPU; it swaps nn.Linear modules whose widths divide by 16, and nothing else).
    amax_reducer: engine "fp8lab" only; see FP8Linear (fp8lab.training.distributed passes an
        all-reduce MAX over ranks).
    strict: raise ValueError where a linear layer would stay in high precision unasked (by default a
        ConversionWarning names them), or where the recipe's high-precision share keeps every site (a model
        of one linear layer under nvfp4_training: its share rounds up to that layer).
    The model is deep-copied unless inplace=True; build the optimizer after converting. Layers are
    converted in place in the (copied) model, so hooks, parametrizations and attributes stay; a model
    that is itself a linear layer is converted too. Converting a converted model again gives its sites
    the new recipe (kept sites go back to their own class). fp8lab.nn.conversion_report(model) says
    what was converted, kept and left, and why.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"convert takes a torch.nn.Module, got {type(model).__name__}")
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r}; valid: {', '.join(ENGINES)}")
    if amax_reducer is not None and engine != "fp8lab":
        raise ValueError("amax_reducer needs engine='fp8lab': torchao computes its activation scales per rank")
    if engine == "torchao" and fp8_layers(model):
        raise ValueError(f"the model holds fp8lab FP8Linear layers ({', '.join(n for n, _ in fp8_layers(model))}): "
                         "convert the original model with engine='torchao', or fp8lab.nn.unwrap(model) first")
    recipe = get_recipe(recipe) if recipe != IDENTITY else recipe
    if not inplace:
        model = copy.deepcopy(model)
    sites, left, other = find_sites(model)
    if not sites:
        raise ValueError(_no_sites(left, other))
    plan, kept = _plan(sites, recipe, skip, keep_first_last, overrides)
    name = recipe.name if isinstance(recipe, Recipe) else str(recipe)
    report = ConversionReport(engine, name, kept=kept, left=left, other=other)
    if engine == "torchao":
        model = _convert_torchao(model, sites, plan, report)
    else:
        backend = default_backend(backend)
        for site in sites:
            _apply(site, plan[site.name], backend, monitor, amax_reducer)
            if plan[site.name] is not None:
                report.converted.append({"module": site.name, "type": site.type, "kind": site.kind,
                                         "recipe": _name(plan[site.name])})
        report.fast_paths_off = _fast_paths_off(model)
    stray = stray_matrices(model, sites)
    if stray:
        report.notes.append("2-D parameters outside the linear layers: " + ", ".join(stray) + ". If the forward "
                            "multiplies by them (a tied output head, F.linear or @ on a raw weight), that GEMM "
                            "stays in high precision")
    if (isinstance(recipe, Recipe) and not report.converted
            and len(recipe.high_precision_layers([s.name for s in sites])) == len(sites)):
        message = (f"{recipe.name} keeps the last {100 * recipe.high_precision_share:g}% of a model's linear layers "
                   f"in high precision, rounded up to at least one: this model has {len(sites)} linear GEMM site(s), "
                   f"so none is converted and it runs in high precision. To convert them, pass "
                   f"fp8lab.get_recipe({recipe.name!r}).with_high_precision_layers(0)")
        if strict:
            raise ValueError(f"convert(strict=True): {message}")
        warnings.warn(message, ConversionWarning, stacklevel=2)
    if report.left:
        message = "linear layers left in high precision: " + "; ".join(
            f"{r['module'] or '(model)'} ({r['type']}): {r['reason']}" for r in report.left)
        if strict:
            raise ValueError(f"convert(strict=True): {message}")
        warnings.warn(message + " (fp8lab.nn.conversion_report(model) lists every site; strict=True raises)",
                      ConversionWarning, stacklevel=2)
    object.__setattr__(model, _REPORT, report)  # (a plain attribute: not a submodule, not in state_dict)
    return model


def _name(recipe: Recipe | str) -> str:
    return recipe.name if isinstance(recipe, Recipe) else str(recipe)


def _plan(sites: list[Site], recipe: Recipe | str, skip, keep_first_last: bool,
          overrides: Mapping[str, Recipe | str | None] | None) -> tuple[dict[str, Recipe | str | None], list[dict]]:
    """Each site's recipe (None: high precision) and the rows of the sites kept as asked."""
    names = [s.name for s in sites]
    keep: dict[str, str] = {}
    if keep_first_last:
        keep.update({names[0]: "keep_first_last", names[-1]: "keep_first_last"})
    if isinstance(recipe, Recipe) and recipe.high_precision_share:  # (an override of a site wins over it)
        overridden = {n for pattern in (overrides or {}) for n in names if fnmatch.fnmatchcase(n, pattern)}
        shared = recipe.high_precision_layers(names)
        keep.update({n: f"{recipe.name} keeps its last {100 * recipe.high_precision_share:g}% of linear layers in "
                     f"high precision, rounded up ({len(shared)} of {len(names)} here)" for n in shared
                     if n not in overridden})
    if callable(skip):
        keep.update({s.name: "skip (your predicate)" for s in sites if skip(s.name, s.module)})
    elif skip is not None:
        skip = [skip] if isinstance(skip, str) else list(skip)
        unknown = sorted(set(skip) - set(names))
        if unknown:
            raise ValueError(f"skip names no linear GEMM site: {unknown}; the sites are {names}")
        keep.update(dict.fromkeys(skip, "skip"))
    chosen: dict[str, Recipe | str | None] = dict.fromkeys(names, recipe)
    for pattern, value in (overrides or {}).items():
        matched = [n for n in names if fnmatch.fnmatchcase(n, pattern)]
        if not matched:
            raise ValueError(f"overrides pattern {pattern!r} matches no linear GEMM site; the sites are {names}")
        value = None if value is None else (value if value == IDENTITY else get_recipe(value))
        for n in matched:
            if n not in keep and chosen[n] is recipe:  # the first pattern that matches a site wins
                chosen[n] = value
                if value is None:
                    keep[n] = f"overrides[{pattern!r}] = None"
    for n in keep:
        chosen[n] = None
    by_name = {s.name: s for s in sites}
    kept = [{"module": n, "type": by_name[n].type, "kind": by_name[n].kind, "reason": why} for n, why in keep.items()]
    return chosen, kept


def _apply(site: Site, recipe: Recipe | str | None, backend: GemmBackend, monitor: Monitor | None,
           amax_reducer: AmaxReducer | None) -> None:
    m = site.module
    if site.kind == IN_PROJ:
        if type(m) is nn.MultiheadAttention:
            m.__class__ = FP8MultiheadAttention  # (its out_proj is called as a module from now on)
        m.setup_fp8(recipe, backend, monitor, _module_of(site.name, IN_PROJ), amax_reducer)
    elif recipe is None:
        if isinstance(m, FP8Linear):
            _make_plain(m)
    else:
        _make_fp8(m, recipe, backend, monitor, site.name, amax_reducer)


def _make_fp8(m: nn.Linear, recipe: Recipe | str, backend: GemmBackend, monitor: Monitor | None, name: str,
              amax_reducer: AmaxReducer | None) -> None:
    if isinstance(m, nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params():
        m.cls_to_become = FP8Linear  # at its first forward (which runs FP8Linear's) it becomes an FP8Linear
    m.__class__ = fp8_class(type(m))
    m.setup_fp8(recipe, backend, monitor, name, amax_reducer)


def _make_plain(m: FP8Linear) -> None:
    m.__class__ = base_class(type(m))
    for attribute in _FP8_ATTRIBUTES:
        m.__dict__.pop(attribute, None)
    if m.__dict__.get("cls_to_become") is FP8Linear:
        del m.cls_to_become


def _fast_paths_off(model: nn.Module) -> list[str]:
    """Turn off torch's fused evaluation paths (they read the weights directly); the modules' names."""
    off = []
    for name, m in model.named_modules():
        for cls, (attribute, value) in FAST_PATH_SWITCHES.items():
            if isinstance(m, cls) and hasattr(m, attribute):
                m.__dict__.setdefault("fp8lab_fast_path", getattr(m, attribute))  # (unwrap puts it back)
                setattr(m, attribute, value)
                off.append(f"{name or '(model)'} ({cls.__name__})")
    return off


def stray_matrices(model: nn.Module, sites: list[Site]) -> list[str]:
    """2-D parameters outside the sites (embeddings, raw projection weights)."""
    owned = set()
    for s in sites:
        module = _module_of(s.name, s.kind)
        prefix = f"{module}." if module else ""
        if s.kind == IN_PROJ:
            owned |= {prefix + w for w in ("in_proj_weight", "q_proj_weight", "k_proj_weight", "v_proj_weight")}
        else:
            owned |= {prefix + "weight", prefix + "parametrizations.weight.original",
                      prefix + "parametrizations.weight.original0", prefix + "parametrizations.weight.original1",
                      prefix + "weight_v", prefix + "weight_g", prefix + "weight_orig"}
    return [n for n, p in model.named_parameters()
            if not isinstance(p, nn.parameter.UninitializedParameter) and p.dim() == 2 and n not in owned]


def _no_sites(left: list[dict], other: list[dict]) -> str:
    found = [f"{d['module'] or '(model)'} ({d['type']}): {d['reason']}" for d in [*left, *other]]
    return ("the model has no linear layers to convert (nn.Linear, a subclass without a forward of its own, "
            "or nn.MultiheadAttention)" + (". Found instead: " + "; ".join(found[:6]) if found else ""))


# ---- torchao ------------------------------------------------------------------------------------------------------


def _convert_torchao(model: nn.Module, sites: list[Site], plan: dict, report: ConversionReport) -> nn.Module:
    name = report.recipe
    if name not in TORCHAO_RECIPES:
        raise ValueError(
            f"torchao's float8 training has recipes {', '.join(TORCHAO_RECIPES)}, not {name!r}; "
            "use engine='fp8lab' for it (torchao removed delayed scaling in 2025; its MX and "
            "blockwise training paths need a GPU)"
        )
    if any(r is not None and _name(r) != name for r in plan.values()):
        raise ValueError("engine='torchao' converts a model with one recipe: overrides may keep sites in high "
                         "precision (None) but not give them other recipes; use engine='fp8lab' for that")
    require("torchao", "convert(engine='torchao')")
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    config = Float8LinearConfig.from_recipe_name(name)
    if not torch.cuda.is_available():
        config = replace(config, emulate=True)  # no FP8 kernels: torchao's emulation
    chosen: dict[int, str] = {}
    for site in sites:
        m = site.module
        if plan[site.name] is None:
            continue
        if site.kind == IN_PROJ:
            reason = ("torchao's float8 training swaps nn.Linear modules; nn.MultiheadAttention applies its in- and "
                      "out-projection with the raw weights, so they stay in high precision (engine='fp8lab' "
                      "converts them)")
            report.left.append({"module": site.name, "type": site.type, "reason": reason})
            out_proj = _module_of(site.name, IN_PROJ)
            report.left.append({"module": f"{out_proj}.out_proj" if out_proj else "out_proj", "type": "out_proj",
                                "reason": reason})
        elif any(s.kind == IN_PROJ and m is s.module.out_proj for s in sites):
            continue  # (reported with its attention's in-projection)
        elif m.in_features % 16 or m.out_features % 16:
            report.left.append({"module": site.name, "type": site.type,
                                "reason": f"torchao's float8 kernels need both widths divisible by 16, this layer "
                                          f"is {m.in_features} -> {m.out_features} (engine='fp8lab' takes any)"})
        elif type(m) is not nn.Linear:
            report.left.append({"module": site.name, "type": site.type,
                                "reason": "torchao's Float8Linear.from_float rebuilds the layer from nn.Linear's "
                                          "attributes: a parametrized, lazy or subclassed layer would lose what it "
                                          "adds (engine='fp8lab' keeps it)"})
        else:
            chosen[id(m)] = site.name

    def module_filter(mod: nn.Module, fqn: str) -> bool:
        return id(mod) in chosen

    model = convert_to_float8_training(model, config=config, module_filter_fn=module_filter)
    for fqn, m in model.named_modules():
        if type(m).__name__ == "Float8Linear":
            report.converted.append({"module": fqn, "type": "Float8Linear", "kind": LINEAR, "recipe": name})
    return model


# ---- back, and what is FP8 ----------------------------------------------------------------------------------------


def fp8_layers(model: nn.Module) -> list[tuple[str, FP8Linear]]:
    """The FP8Linear layers of a model (FP8 subclasses of other linear classes included), with their names."""
    return [(n, m) for n, m in model.named_modules() if isinstance(m, FP8Linear)]


def unwrap(model: nn.Module) -> nn.Module:
    """A copy of the model with every FP8 layer back to its own class (same weights, hooks and
    parametrizations), every FP8 attention back to nn.MultiheadAttention and the fused evaluation
    paths back as they were."""
    model = copy.deepcopy(model)
    for m in model.modules():
        if isinstance(m, FP8Linear):
            _make_plain(m)
        elif type(m) is FP8MultiheadAttention:
            m.__class__ = nn.MultiheadAttention
            m.__dict__.pop("fp8_in_proj", None)
        for cls, (attribute, _) in FAST_PATH_SWITCHES.items():
            if isinstance(m, cls) and "fp8lab_fast_path" in m.__dict__:
                setattr(m, attribute, m.__dict__.pop("fp8lab_fast_path"))
    model.__dict__.pop(_REPORT, None)
    return model
