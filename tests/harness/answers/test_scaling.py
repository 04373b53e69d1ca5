"""fp8lab.harness.answers.scaling: the key's answers for notebooks 02 (per-tensor), 03 (delayed) and 04
(per-block scaling).
Checked: its answers in notebook order, each quick answer's question and claims (tests.harness.answers.part_tests)."""

from fp8lab.harness.answers import scaling
from tests.harness.answers import part_tests

(test_the_answers_are_this_parts_notebooks_in_notebook_order,
 test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold) = part_tests(
    scaling, ('02', '03', '04'), ['_q03_loop'])
