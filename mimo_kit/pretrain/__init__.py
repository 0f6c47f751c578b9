"""Chapter 3: tokenizer, packed data and the pre-training loop with exact resume (Report §3).

>>> from mimo_kit.pretrain import PretrainConfig, run_pretrain, load_tokenizer
>>> result = run_pretrain(PretrainConfig.preset("tiny", steps=100, out_dir="runs/backbone"))
>>> result.model, result.tokenizer, result.log["val_loss"][-1]
"""

from mimo_kit.pretrain.config import PretrainConfig
from mimo_kit.pretrain.data import PackedLoader, encode_documents, eval_batches, token_streams
from mimo_kit.pretrain.loop import PretrainResult, Trainer, latest_checkpoint, load_pretrained, run_pretrain
from mimo_kit.pretrain.tokenizer import CHAT_TEMPLATE, SPECIAL_TOKENS, load_tokenizer, train_tokenizer

__all__ = ["CHAT_TEMPLATE", "PackedLoader", "PretrainConfig", "PretrainResult", "SPECIAL_TOKENS", "Trainer",
           "encode_documents", "eval_batches", "latest_checkpoint", "load_pretrained", "load_tokenizer",
           "run_pretrain", "token_streams", "train_tokenizer"]
