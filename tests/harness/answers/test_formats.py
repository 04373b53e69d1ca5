"""fp8lab.harness.answers.formats: the key's answers for notebooks 00 (setup check) and 01 (FP8 formats).
Checked: its answers in notebook order, each quick answer's question and claims (tests.harness.answers.part_tests)."""

from fp8lab.harness.answers import formats
from tests.harness.answers import part_tests

(test_the_answers_are_this_parts_notebooks_in_notebook_order,
 test_a_quick_answer_asks_its_notebooks_question_and_its_claims_hold) = part_tests(
    formats, ('00', '01'), ['_q00_real', '_q01_rounding', '_q01_precision'])
