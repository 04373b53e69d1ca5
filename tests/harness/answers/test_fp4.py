"""fp8lab.harness.answers.fp4: the key's answers for notebooks 09 (below eight bits, the gradient side).
Checked: its answers in notebook order, each quick answer's question and claims (tests.harness.answers.part_tests)."""

from fp8lab.harness.answers import fp4
from tests.harness.answers import part_tests

(test_the_answers_are_this_parts_notebooks_in_notebook_order,
 test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold) = part_tests(
    fp4, ('09',), ['_q09_dy_losses', '_q09_parts'])
