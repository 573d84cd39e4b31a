"""A built-in, seeded workload shaped like agent traffic, for profiling an engine with no live traffic.

Agent traffic is many concurrent chat requests that share a few long system prompts (tool
descriptions, instructions), continue earlier conversations (long common prefixes that grow turn
by turn), and vary in question and answer length. Every request is greedy with ignore_eos, so its
output length is exactly `max_tokens` and runs are comparable.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

_TOOLS = ["search(query)", "read_file(path)", "run_tests(target)", "write_file(path, text)", "list_dir(path)",
          "grep(pattern, path)", "http_get(url)", "python(code)"]
_TOPICS = ["the billing service", "the login page", "the nightly export", "the cache layer", "the search index",
           "the payment retries", "the image resizer", "the audit log"]
_ASKS = ["What is 3 plus 4?", "Summarise the last result.", "Which tool should run next?", "Is the test fixed?",
         "List the files that changed.", "Why did the build fail?", "What is 12 minus 5?", "Write a short plan."]


@dataclass(frozen=True)
class WorkloadRequest:
    messages: list[dict[str, str]]
    max_tokens: int


def _system_prompt(rng: random.Random, index: int) -> str:
    tools = rng.sample(_TOOLS, 5)
    rules = "Keep answers short. Cite the tool you used."
    return (f"You are agent number {index}. You can call these tools: {', '.join(tools)}. {rules} "
            "Think step by step, then answer in one sentence.")


def agent_workload(requests: int = 32, seed: int = 0, max_tokens: tuple[int, int] = (4, 24)) -> list[WorkloadRequest]:
    """`requests` chat requests: 3 shared system prompts, conversations 1 to 4 turns deep."""
    rng = random.Random(seed)
    systems = [_system_prompt(rng, i) for i in range(3)]
    conversations: list[list[dict[str, str]]] = []
    out: list[WorkloadRequest] = []
    for _ in range(requests):
        if conversations and rng.random() < 0.5:  # continue a conversation: its whole history is a shared prefix
            history = rng.choice(conversations)
            history.append({"role": "assistant", "content": f"I checked {rng.choice(_TOPICS)} with {rng.choice(_TOOLS)}."})
        else:
            history = [{"role": "system", "content": rng.choice(systems)}]
            conversations.append(history)
        history.append({"role": "user", "content": f"About {rng.choice(_TOPICS)}: {rng.choice(_ASKS)}"})
        out.append(WorkloadRequest([dict(m) for m in history], rng.randint(*max_tokens)))
    return out


def summarize_latencies(ttft: list[float], tpot: list[float]) -> dict[str, Any]:
    """Median time to first token and per output token, in milliseconds."""
    def median_ms(xs: list[float]) -> float | None:
        s = sorted(xs)
        return 1e3 * s[len(s) // 2] if s else None

    return {"ttft_ms_median": median_ms(ttft), "tpot_ms_median": median_ms(tpot)}
