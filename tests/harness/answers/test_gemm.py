"""fp8lab.harness.answers.gemm: the key's answers for notebooks 05 (the FP8 GEMM).
Checked: its answers in notebook order, each quick answer's question and claims (tests.harness.answers.part_tests)."""

from fp8lab.harness.answers import gemm
from tests.harness.answers import part_tests

(test_the_answers_are_this_parts_notebooks_in_notebook_order,
 test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold) = part_tests(
    gemm, ('05',), ['_q05_gemm'], slow=True)  # the GEMM panel at workshop size (seconds)
