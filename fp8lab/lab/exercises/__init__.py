"""Workshop exercises: check_* gives specific feedback, hint_* a nudge, solution_* the answer.

One module per notebook; every name is importable from here (`from fp8lab.lab import exercises as ex`):
  base.py      Feedback (what a check returns: ok, and a message naming the case that failed and why; a
               wrong type, shape, sign or size of answer gets one too, saying what it got and what was asked)
  formats.py   01 decode an E4M3 code           check_decode, hint_decode, solution_decode
  scaling.py   02 the per-tensor E4M3 scale     check_scale, hint_scale, solution_scale
               03 the amax of delayed scaling   check_delayed_amax, hint_delayed_amax, solution_delayed_amax
  blocks.py    04 per-block amax; FP4 blocks    check_block_amax, ...; check_block_choice, ...
  gemm.py      05 the scaled FP8 GEMM           check_scaled_gemm, ... (operands: GemmOperand)
  training.py  06 which recipes survive sinks   check_survivors, hint_survivors, solution_survivors
               06b the longest amax history     check_history, hint_history, solution_history
               06c does step 30 predict 150?    check_ranking, hint_ranking, solution_ranking
  capstone.py  08 a recipe for your model       check_capstone, hint_capstone, solution_capstone
  fp4.py       09 stochastic rounding by hand   check_stochastic_round, hint_stochastic_round, ...
               09b fc1's forward or its wgrad    check_fc1_split, hint_fc1_split, solution_fc1_split
Solutions are printed only when a learner asks for them.
"""

from fp8lab.lab.exercises.base import Feedback
from fp8lab.lab.exercises.blocks import (
    CHOICE_BLOCKS,
    block_choice_tensor,
    check_block_amax,
    check_block_choice,
    hint_block_amax,
    hint_block_choice,
    solution_block_amax,
    solution_block_choice,
)
from fp8lab.lab.exercises.capstone import MONITORS, check_capstone, hint_capstone, solution_capstone
from fp8lab.lab.exercises.formats import check_decode, hint_decode, solution_decode
from fp8lab.lab.exercises.fp4 import (
    SPLIT_TOLERANCE,
    check_fc1_split,
    check_stochastic_round,
    fc1_split_answer,
    hint_fc1_split,
    hint_stochastic_round,
    solution_fc1_split,
    solution_stochastic_round,
)
from fp8lab.lab.exercises.gemm import GemmOperand, check_scaled_gemm, hint_scaled_gemm, solution_scaled_gemm
from fp8lab.lab.exercises.scaling import (
    check_delayed_amax,
    check_scale,
    hint_delayed_amax,
    hint_scale,
    solution_delayed_amax,
    solution_scale,
)
from fp8lab.lab.exercises.training import (
    RECOVER_WITHIN,
    SURVIVAL_LIMIT,
    SURVIVAL_SINKS,
    check_history,
    check_ranking,
    check_survivors,
    hint_history,
    hint_ranking,
    hint_survivors,
    history_answer,
    ranking_answer,
    solution_history,
    solution_ranking,
    solution_survivors,
)

__all__ = [
    "CHOICE_BLOCKS",
    "MONITORS",
    "RECOVER_WITHIN",
    "SPLIT_TOLERANCE",
    "SURVIVAL_LIMIT",
    "SURVIVAL_SINKS",
    "Feedback",
    "GemmOperand",
    "block_choice_tensor",
    "check_block_amax",
    "check_block_choice",
    "check_capstone",
    "check_decode",
    "check_delayed_amax",
    "check_fc1_split",
    "check_history",
    "check_ranking",
    "check_scale",
    "check_scaled_gemm",
    "check_stochastic_round",
    "check_survivors",
    "fc1_split_answer",
    "hint_block_amax",
    "hint_block_choice",
    "hint_capstone",
    "hint_decode",
    "hint_delayed_amax",
    "hint_fc1_split",
    "hint_history",
    "hint_ranking",
    "hint_scale",
    "hint_scaled_gemm",
    "hint_stochastic_round",
    "hint_survivors",
    "history_answer",
    "ranking_answer",
    "solution_block_amax",
    "solution_block_choice",
    "solution_capstone",
    "solution_decode",
    "solution_delayed_amax",
    "solution_fc1_split",
    "solution_history",
    "solution_ranking",
    "solution_scale",
    "solution_scaled_gemm",
    "solution_stochastic_round",
    "solution_survivors",
]
