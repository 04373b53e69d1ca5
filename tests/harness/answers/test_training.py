"""fp8lab.harness.answers.training: the key's answers for notebooks 06 (training live).
Checked: its answers in notebook order, each quick answer's question and claims (tests.harness.answers.part_tests)."""

from fp8lab.harness.answers import training
from tests.harness.answers import part_tests

(test_the_answers_are_this_parts_notebooks_in_notebook_order,
 test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold) = part_tests(
    training, ('06',), ['_q06_cliff', '_q06_flush', '_q06_drift'])
