"""The kit's tokenizer: byte-level BPE trained on local text, saved as a transformers tokenizer (Report §3).

MiMo-V2's public tokenizer has 152,576 entries; the kit cannot download it (no network) and a toy model could not
use it, so it trains its own with HF ``tokenizers`` on text every machine has (:func:`mimo_kit.corpus.documents`:
the Python stdlib's sources plus the kit's shipped markdown, train split only). The vocabulary size is the
model preset's ``vocab_size`` (tiny 512, small 8192), special tokens included.

Byte-level BPE: text → UTF-8 bytes mapped to 256 printable symbols (GPT-2's ``ByteLevel``), then merges learned
greedily by pair frequency. Every byte is in the base alphabet, so no input is ever out of vocabulary.

The chat template covers system / user / assistant / tool messages, a tool list, and assistant tool calls
(``<tool_call>{"name": …, "arguments": …}</tool_call>``); assistant turns are wrapped in ``{% generation %}``, so
``apply_chat_template(..., return_assistant_tokens_mask=True)`` marks exactly the tokens an assistant-only loss
trains on (the content, the tool calls and the closing ``<|im_end|>``, which teaches the model to stop).

Trained tokenizers are cached under ``$MIMO_KIT_CACHE`` (default ``~/.cache/mimo_kit``) in a folder named by a
hash of the training text and settings: same text → same folder → same tokenizer; nothing is ever downloaded.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from mimo_kit.cache import cache_root
from mimo_kit.corpus import document_split, documents

EOS, PAD = "<|endoftext|>", "<|pad|>"
IM_START, IM_END = "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [EOS, PAD, IM_START, IM_END, "<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>",
                  "<think>", "</think>"]
BYTE_ALPHABET = 256

# transformers renders templates with trim_blocks/lstrip_blocks, so every newline is emitted as a string literal.
CHAT_TEMPLATE = (
    "{%- macro tool_list() -%}"
    "{{ '\\n<tools>' }}{%- for tool in tools -%}{{ '\\n' + (tool | tojson) }}{%- endfor -%}{{ '\\n</tools>' }}"
    "{%- endmacro -%}"
    "{%- if tools and messages[0].role != 'system' -%}"
    "{{ '<|im_start|>system' }}{{ tool_list() }}{{ '<|im_end|>\\n' }}"
    "{%- endif -%}"
    "{%- for message in messages -%}"
    "{%- if message.role == 'system' -%}"
    "{{ '<|im_start|>system\\n' + message.content }}"
    "{%- if tools and loop.first -%}{{ tool_list() }}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- elif message.role == 'user' -%}"
    "{{ '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' -%}"
    "{{ '<|im_start|>assistant\\n' }}"
    "{%- generation -%}"
    "{{ message.content or '' }}"
    "{%- for call in message.tool_calls or [] -%}"
    "{%- set fn = call.function if call.function is defined else call -%}"
    "{{ '<tool_call>\\n{\"name\": ' + (fn.name | tojson) + ', \"arguments\": ' }}"
    "{%- if fn.arguments is string -%}{{ fn.arguments }}{%- else -%}{{ fn.arguments | tojson }}{%- endif -%}"
    "{{ '}\\n</tool_call>' }}"
    "{%- endfor -%}"
    "{{ '<|im_end|>' }}"
    "{%- endgeneration -%}"
    "{{ '\\n' }}"
    "{%- elif message.role == 'tool' -%}"
    "{{ '<|im_start|>tool\\n<tool_response>\\n' + message.content + '\\n</tool_response><|im_end|>\\n' }}"
    "{%- else -%}"
    "{{ raise_exception('unknown chat role: ' + message.role) }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)


def _training_text(corpus_bytes: int | None, val_fraction: float) -> list[str]:
    train, _ = document_split(documents(corpus_bytes), val_fraction)
    return [text for _, text in train]


def tokenizer_key(vocab_size: int, corpus_bytes: int | None = None, val_fraction: float = 0.05,
                  min_frequency: int = 2) -> str:
    """Folder name of a trained tokenizer: its settings and a hash of its training text."""
    h = hashlib.sha256(json.dumps([vocab_size, corpus_bytes, val_fraction, min_frequency, SPECIAL_TOKENS,
                                   CHAT_TEMPLATE]).encode())
    for text in _training_text(corpus_bytes, val_fraction):
        h.update(text.encode())
    return f"bpe-{vocab_size}-{h.hexdigest()[:12]}"


def fit_bpe(texts, vocab_size: int, special_tokens: list[str], *, min_frequency: int = 0, use_regex: bool = True,
            max_token_length: int | None = None):
    """A byte-level BPE (HF ``tokenizers``) of ``vocab_size`` entries over ``texts``: the one BPE trainer of the kit
    (the pretraining tokenizer, the distillation traces' tokenizer and the repo world's all call it).

    ``use_regex`` splits words before merging (GPT-2's pre-tokenizer); ``max_token_length`` caps a merge's length.
    Returns the ``tokenizers.Tokenizer``; a ``vocab_size`` below the byte alphabet plus the special tokens raises.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    minimum = BYTE_ALPHABET + len(special_tokens)
    if vocab_size < minimum:
        raise ValueError(f"fit_bpe: vocab_size={vocab_size}; a byte-level BPE needs at least {minimum} "
                         f"(256 bytes + {len(special_tokens)} special tokens)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=use_regex)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False,
                                  max_token_length=max_token_length)
    tok.train_from_iterator(texts, trainer=trainer)
    return tok


def chat_tokenizer(texts, vocab_size: int, out_dir: str | Path, min_frequency: int = 2):
    """A BPE over ``texts`` (:func:`fit_bpe`) with the ChatML special tokens and the kit's chat template, saved to
    ``out_dir`` as a transformers tokenizer (``PreTrainedTokenizerFast``), which it returns."""
    from transformers import PreTrainedTokenizerFast

    tok = fit_bpe(texts, vocab_size, SPECIAL_TOKENS, min_frequency=min_frequency)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS, pad_token=PAD,
                                   additional_special_tokens=SPECIAL_TOKENS[2:], model_max_length=1 << 20)
    fast.chat_template = CHAT_TEMPLATE
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(out)
    return fast


def train_tokenizer(vocab_size: int, out_dir: str | Path, corpus_bytes: int | None = None,
                    val_fraction: float = 0.05, min_frequency: int = 2):
    """Train a byte-level BPE of ``vocab_size`` entries on the corpus's train split; save it to ``out_dir``.

    Returns the transformers tokenizer (``PreTrainedTokenizerFast``) with the chat template set.
    """
    return chat_tokenizer(_training_text(corpus_bytes, val_fraction), vocab_size, out_dir, min_frequency)


def cached_tokenizer(folder: Path, train) -> object:
    """The transformers tokenizer saved in ``folder``, first written there by ``train(tmp_folder)`` when missing:
    trained into a private folder, then renamed (a concurrent process sees the whole folder or trains its own)."""
    from transformers import AutoTokenizer

    if not (folder / "tokenizer.json").is_file():
        tmp = folder.with_name(folder.name + f".tmp{os.getpid()}")
        train(tmp)
        try:
            tmp.rename(folder)
        except OSError:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    tok = AutoTokenizer.from_pretrained(folder)
    tok.name_or_path = str(folder)
    return tok


def load_tokenizer(vocab_size: int = 512, corpus_bytes: int | None = None, *, val_fraction: float = 0.05,
                   min_frequency: int = 2, cache_dir: str | Path | None = None):
    """The kit's tokenizer of ``vocab_size`` entries, trained on first use and cached (never downloaded).

    >>> tok = load_tokenizer(512)     # the tiny preset's tokenizer
    """
    folder = Path(cache_dir or cache_root() / "tokenizers") / tokenizer_key(vocab_size, corpus_bytes, val_fraction,
                                                                            min_frequency)
    return cached_tokenizer(folder, lambda tmp: train_tokenizer(vocab_size, tmp, corpus_bytes, val_fraction,
                                                                min_frequency))
