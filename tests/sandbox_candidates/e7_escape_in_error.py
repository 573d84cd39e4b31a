"""Exploit (display): forward raises an error whose message is a terminal attack: clear the screen
(ESC[2J), an OSC 8 hyperlink, a carriage return and backspaces that overwrite the line with a fake
verdict, a C1 CSI, and bidi overrides and isolates that reorder what a reader sees. The source itself
is plain ASCII (the characters are built from escapes), so only the display layer can stop it.

Verdict: `raised`; its reason must show every one of those characters as a visible escape, in the
CLI table, the JSON line, history, the report, the PR body and the LLM's feedback
(tests/test_display_safety.py).
"""
# expect: static=raised runtime=raised

from __future__ import annotations

import torch

ESC, BEL = "\x1b", "\x07"
PAYLOAD = (ESC + "[2J" + ESC + "[H" + ESC + "]8;;http://attacker.example/" + BEL + "details" + ESC + "]8;;" + BEL
           + " \rACCEPTED 9.99x\b\b\b \x9b31m \u202eevil\u202c \u2066isolated\u2069 \u200bzero-width\ufeff")


def forward(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    raise ValueError(PAYLOAD)
