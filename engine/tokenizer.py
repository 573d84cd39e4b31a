"""The engine's tokenizer: a thin wrapper over a Hugging Face model directory's tokenizer files.

Reads, from any HF-format model directory:

- `tokenizer.json` (required), through the `tokenizers` library: encode/decode, special tokens,
  and the post-processor that adds BOS (Llama 3 style);
- `tokenizer_config.json` (optional): `chat_template` (a string, or a list of named templates of
  which "default" is used), `bos_token`/`eos_token` (strings or AddedToken dicts); a template in
  `chat_template.jinja` is used when the config has none;
- `generation_config.json` and `config.json` (optional): `eos_token_id` (an int or a list).

Chat templates are rendered the way transformers renders them (a sandboxed jinja2 environment with
`trim_blocks`, `lstrip_blocks`, `raise_exception`, `tojson`, and the special tokens as variables).
A rendered chat already starts with the BOS token text, so encode it with
`add_special_tokens=False`, as transformers does.
"""

from __future__ import annotations

import json
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _HFTokenizer


class TokenizerError(ValueError):
    """A model directory's tokenizer files are missing or unusable (the message names the file)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    # Like transformers: jinja's own tojson escapes HTML characters, which templates don't expect.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat_template(template: str, messages: list[dict[str, Any]],
                         add_generation_prompt: bool = True, **variables: Any) -> str:
    """Render a jinja chat template; errors (syntax or `raise_exception`) become ValueError."""
    try:
        return _compile(template).render(messages=messages, add_generation_prompt=add_generation_prompt,
                                         **variables)
    except jinja2.exceptions.TemplateError as e:
        raise ValueError(f"chat template error: {e}") from e


def _read_json(path: Path) -> dict[str, Any]:
    """The JSON object in `path`, {} when the file is absent; TokenizerError when unreadable."""
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise TokenizerError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict):
        raise TokenizerError(f"{path} should hold a JSON object, not {type(data).__name__}")
    return data


def _token_text(value: Any) -> str | None:
    """A special token given as a string or as an AddedToken dict ({"content": ...})."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    """An `eos_token_id` field: an int, a list of ints, or absent."""
    if isinstance(value, bool):
        return []
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


class Tokenizer:
    """Encode, decode and chat-template rendering for one model directory."""

    def __init__(self, tokenizer: _HFTokenizer, config: dict[str, Any] | None = None,
                 extra_eos_ids: list[int] | None = None, chat_template: str | dict[str, str] | None = None):
        """Usually made by `from_dir`. `config`: tokenizer_config.json's content; `extra_eos_ids`:
        more end-of-sequence ids (generation_config.json); `chat_template`: one template or
        templates by name."""
        self._tok = tokenizer
        config = config or {}
        self.special_tokens: dict[str, str] = {}
        for key in ("bos_token", "eos_token", "unk_token", "pad_token"):
            text = _token_text(config.get(key))
            if text is not None:
                self.special_tokens[key] = text
        self.bos_token_id: int | None = self.token_to_id(self.special_tokens.get("bos_token"))
        eos = [self.token_to_id(self.special_tokens.get("eos_token"))] + list(extra_eos_ids or [])
        self.eos_token_ids: frozenset[int] = frozenset(i for i in eos if i is not None)
        self._chat_template = chat_template

    @classmethod
    def from_dir(cls, path: str | Path) -> "Tokenizer":
        """Load the tokenizer of the HF model directory `path`."""
        path = Path(path)
        tok_file = path / "tokenizer.json"
        if not tok_file.is_file():
            raise TokenizerError(f"{tok_file} is missing: the engine needs a Hugging Face "
                                 "tokenizer.json in the model directory")
        try:
            tokenizer = _HFTokenizer.from_file(str(tok_file))
        except Exception as e:  # the Rust library raises plain Exception subclasses
            raise TokenizerError(f"{tok_file} is not a valid tokenizers file: {e}") from e
        config = _read_json(path / "tokenizer_config.json")
        generation = _read_json(path / "generation_config.json")
        model_config = _read_json(path / "config.json")
        eos_ids = _ids(generation.get("eos_token_id")) + _ids(model_config.get("eos_token_id"))
        template = config.get("chat_template")
        if isinstance(template, list):  # [{"name": "default", "template": "..."}, ...]
            template = {t["name"]: t["template"] for t in template
                        if isinstance(t, dict) and "name" in t and "template" in t}
        if template is None and (path / "chat_template.jinja").is_file():
            template = (path / "chat_template.jinja").read_text(encoding="utf-8")
        tok = cls(tokenizer, config, eos_ids, template)
        if tok.bos_token_id is None:  # no bos_token in tokenizer_config.json
            bos = _ids(generation.get("bos_token_id")) or _ids(model_config.get("bos_token_id"))
            tok.bos_token_id = bos[0] if bos else None
        return tok

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added (special) tokens included."""
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def chat_template(self) -> str | None:
        """The template `apply_chat_template` uses ("default" of several), or None."""
        if isinstance(self._chat_template, dict):
            return self._chat_template.get("default")
        return self._chat_template

    def token_to_id(self, token: str | None) -> int | None:
        """The id of one token string, or None if it is not in the vocabulary."""
        return None if token is None else self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of one id, or None if out of range."""
        return self._tok.id_to_token(token_id)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`; `add_special_tokens` runs the post-processor (adds BOS)."""
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_without_gil(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """`encode`, releasing the GIL while the Rust side works (`encode` holds it throughout): call
        it from a worker thread, so a long text stalls neither an event loop nor the engine thread."""
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`, special tokens dropped unless `skip_special_tokens` is False."""
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True,
                            **variables: Any) -> str:
        """The chat prompt text for `messages` (encode it with add_special_tokens=False)."""
        template = self.chat_template
        if template is None:
            if isinstance(self._chat_template, dict):
                names = ", ".join(sorted(self._chat_template))
                raise ValueError(f"this model has chat templates named {names} but none named 'default'")
            raise ValueError("this model has no chat template (tokenizer_config.json has no "
                             "chat_template), so it cannot serve chat requests; use completions")
        return render_chat_template(template, messages, add_generation_prompt,
                                    **{**self.special_tokens, **variables})
