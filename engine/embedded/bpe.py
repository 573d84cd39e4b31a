"""The embedded model's tokenizer: a byte-level BPE trained on the corpus, Llama 3 conventions.

Special tokens get the first ids (0-4), in the order of SPECIAL_TOKENS. The post-processor adds
`<|begin_of_text|>` in front of every encoded text (as Llama 3's does); the chat template writes
it as text, so rendered chats are encoded with add_special_tokens=False.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors, trainers

BOS, EOS = "<|begin_of_text|>", "<|end_of_text|>"
START_HEADER, END_HEADER, EOT = "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>"
SPECIAL_TOKENS = (BOS, EOS, START_HEADER, END_HEADER, EOT)
_SPECIAL_RE = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS))
# Llama 3's pre-tokenizer split (so "\n\n" is one token), except that numbers keep a leading
# space like words (" 7" rather than " " + "7"): fewer tokens per arithmetic answer.
SPLIT_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+| ?\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Llama 3's template, minus its date/tool handling, plus a check that content is a string.
CHAT_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- for message in messages %}\n"
    "    {%- if message['content'] is not string %}\n"
    "        {{- raise_exception('message content must be a string') }}\n"
    "    {%- endif %}\n"
    "    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' "
    "+ message['content'] | trim + '<|eot_id|>' }}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> Tokenizer:
    """A byte-level BPE with at most `vocab_size` ids (fewer if the corpus has fewer merges)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Train on the text between special tokens, so no merge ever spans one.
    pieces = (p for text in texts for p in _SPECIAL_RE.split(text) if p)
    tok.train_from_iterator(pieces, trainer)
    bos_id = tok.token_to_id(BOS)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS} $A",
            pair=f"{BOS} $A {BOS}:1 $B:1",
            special_tokens=[(BOS, bos_id)],
        ),
    ])
    return tok


def tokenizer_config() -> dict:
    """tokenizer_config.json: the chat template and the special tokens, as transformers reads it."""
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOT,
        "pad_token": EOS,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_input_names": ["input_ids", "attention_mask"],
        "model_max_length": 2048,
    }
