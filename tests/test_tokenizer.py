"""The kit's byte-level BPE tokenizer: deterministic training, lossless round trips, chat template and masks."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mimo_kit.corpus import document_split, documents
from mimo_kit.pretrain.tokenizer import SPECIAL_TOKENS, load_tokenizer, train_tokenizer

CORPUS = 300_000  # bytes: enough for 512 entries, trains in about a second


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return load_tokenizer(512, CORPUS, cache_dir=tmp_path_factory.mktemp("tok"))


def test_training_is_deterministic(tmp_path):
    train_tokenizer(300, tmp_path / "a", corpus_bytes=100_000)
    train_tokenizer(300, tmp_path / "b", corpus_bytes=100_000)
    a, b = (json.loads((tmp_path / d / "tokenizer.json").read_text()) for d in "ab")
    assert a["model"]["vocab"] == b["model"]["vocab"] and a["model"]["merges"] == b["model"]["merges"]


def test_vocab_size_special_tokens_and_cache(tok, tmp_path):
    assert len(tok) == 512
    for t in SPECIAL_TOKENS:
        assert tok.convert_tokens_to_ids(t) < 512 and tok.convert_ids_to_tokens(tok.convert_tokens_to_ids(t)) == t
        assert len(tok(t, add_special_tokens=False)["input_ids"]) == 1
    assert tok.eos_token == "<|endoftext|>" and tok.pad_token == "<|pad|>"
    with pytest.raises(ValueError, match="vocab_size=100"):
        train_tokenizer(100, tmp_path / "small")


def test_merges_compress_python_source(tok):
    text = "def __init__(self, name):\n        self.name = name\n        return None\n"
    assert len(tok(text)["input_ids"]) < 0.6 * len(text.encode())


@pytest.mark.slow
@settings(max_examples=40, deadline=None)
@given(st.text(max_size=200))
def test_round_trip_any_text(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert all(0 <= i < 512 for i in ids)
    assert tok.decode(ids) == text


def test_chat_template_renders_every_role_and_tool_calls(tok):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "list files"},
        {"role": "assistant", "content": "",
         "tool_calls": [{"type": "function", "function": {"name": "ls", "arguments": {"path": "."}}}]},
        {"role": "tool", "content": "a.py"},
        {"role": "assistant", "content": "One file: a.py"},
    ]
    text = tok.apply_chat_template(messages, tools=[{"name": "ls"}], tokenize=False)
    assert text == (
        "<|im_start|>system\nBe brief.\n<tools>\n{\"name\": \"ls\"}\n</tools><|im_end|>\n"
        "<|im_start|>user\nlist files<|im_end|>\n"
        "<|im_start|>assistant\n<tool_call>\n{\"name\": \"ls\", \"arguments\": {\"path\": \".\"}}\n</tool_call>"
        "<|im_end|>\n"
        "<|im_start|>tool\n<tool_response>\na.py\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\nOne file: a.py<|im_end|>\n")
    prompt = tok.apply_chat_template(messages[1:2], tokenize=False, add_generation_prompt=True)
    assert prompt == "<|im_start|>user\nlist files<|im_end|>\n<|im_start|>assistant\n"
    with pytest.raises(Exception, match="unknown chat role: robot"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}], tokenize=False)


def test_assistant_mask_covers_exactly_the_assistant_turns(tok):
    messages = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"},
                {"role": "user", "content": "and 3+3?"}, {"role": "assistant", "content": "6, by adding."}]
    out = tok.apply_chat_template(messages, tokenize=True, return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    assert len(ids) == len(mask)
    assert tok.decode([i for i, m in zip(ids, mask) if m]) == "4<|im_end|>6, by adding.<|im_end|>"
    assert "user" in tok.decode([i for i, m in zip(ids, mask) if not m])


def test_document_split_is_deterministic_and_disjoint():
    docs = documents()
    train, val = document_split(docs)
    assert document_split(docs) == (train, val)
    assert {n for n, _ in train}.isdisjoint({n for n, _ in val}) and len(train) + len(val) == len(docs)
    assert 0.01 < sum(len(t) for _, t in val) / sum(len(t) for _, t in docs) < 0.2
    # removing a document does not move any other document across the split
    t2, v2 = document_split(docs[1:])
    assert {n for n, _ in v2} == {n for n, _ in val} - {docs[0][0]}
    with pytest.raises(ValueError, match="val_fraction=1.5"):
        document_split(docs, 1.5)
