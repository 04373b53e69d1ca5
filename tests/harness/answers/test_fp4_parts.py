"""fp8lab.harness.answers.fp4_parts: the key's answers for notebooks 09 (the backward parts at work).
Checked: its answers in notebook order, each quick answer's question and claims (tests.harness.answers.part_tests)."""

from fp8lab.harness.answers import fp4_parts
from tests.harness.answers import part_tests

(test_the_answers_are_this_parts_notebooks_in_notebook_order,
 test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold) = part_tests(
    fp4_parts, ('09',), ['_q09_backward_only'])
