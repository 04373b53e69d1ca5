"""fp8lab.harness.answers.scale_out: the key's answers for notebooks 07 (beyond one machine) and 08 (your model).
Checked: its answers in notebook order, each quick answer's question and claims (tests.harness.answers.part_tests)."""

from fp8lab.harness.answers import scale_out
from tests.harness.answers import part_tests

(test_the_answers_are_this_parts_notebooks_in_notebook_order,
 test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold) = part_tests(
    scale_out, ('07', '08'), ['_q07_ranks', '_q07_gather', '_q08_cost'])
