"""What the LLM proposer reads back to the model: the feedback text for every verdict, and the code taken
from a reply (pure functions; the verdicts are tests/test_llm_proposer.py's)."""

from __future__ import annotations

import pytest

from kernelloop.agent.proposers.llm import extract_code, feedback_text
from kernelloop.sandbox.verdict import FAILURES

from tests.test_llm_proposer import MISMATCH_REASON, NOT_FASTER_TIMING, VERDICTS, verdict

# -- feedback_text per failure code --------------------------------------------------------------

@pytest.mark.parametrize("failure", FAILURES)
def test_feedback_text_names_every_failure_and_its_reason(failure):
    v = VERDICTS.get(failure) or verdict(failure, f"trial 1: something about {failure}")
    text = feedback_text(v)
    assert v["reason"] in text
    assert failure in text or failure == "static" or failure == "load"
    assert "Hint:" in text


def test_feedback_text_specifics():
    assert feedback_text(VERDICTS["static"]).startswith("Rejected by the static check: line 3: import of 'os'")
    load = feedback_text(VERDICTS["load"])
    assert load.startswith("Compile/import error:") and "NameError: name 'tl' is not defined" in load
    assert "Traceback" in load                                                # the process's last output
    assert feedback_text(VERDICTS["sandbox-violation"]).startswith("Runtime violation (sandbox-violation):")
    assert feedback_text(verdict("timeout", "no verdict within 60 s")).startswith("Runtime violation (timeout)")
    assert MISMATCH_REASON in feedback_text(VERDICTS["mismatch"])
    slow = feedback_text(VERDICTS["not-faster"])
    assert "speedup 1.012x (95% interval [0.981, 1.046]) over baseline" in slow
    assert "yours 12.100 ms vs baseline 12.300 ms per call" in slow
    assert "achieved 0.0 GB/s = 0.0% of roofline (copy bandwidth 20.0 GB/s)" in slow
    accepted = verdict(None, "accepted: 1.400x [1.300, 1.500] over baseline", speedup=1.4,
                       speedup_interval=[1.3, 1.5], timing={**NOT_FASTER_TIMING, "roofline_fraction": 0.5})
    text = feedback_text(accepted)
    assert text.startswith("Accepted: accepted: 1.400x") and "50.0% of roofline" in text and "Hint" not in text


# -- parsing a reply -------------------------------------------------------------------

def test_extract_code_takes_the_last_python_block():
    text = "first\n```python\nA = 1\n```\nthen\n```py\nB = 2\n```\n```text\nnot code\n```"
    assert extract_code(text) == "B = 2\n"
    assert extract_code("```\ndef forward(x):\n    pass\n```") == "def forward(x):\n    pass\n"
    assert extract_code("no code at all") is None and extract_code(None) is None
    assert extract_code("```python\nimport torch\ndef forw") is None   # unterminated
