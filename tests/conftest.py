"""Shared fixtures: tiny in-process tokenizers and models, one torch thread per test."""

from __future__ import annotations

import os
from pathlib import Path

os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")  # alignment-independent MKL results (see mas/cli.py)
os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")  # torch's allocator as the mas command sets it (mas/cli.py)

import pytest
import torch

from mas.models.tiny import tiny_causal_lm, train_tokenizer

CORPUS = [
    "You are the orchestrator. Task: 3+4-2 CALL adder: 3+4 ANSWER: 5",
    "You are a solver. Solve the problem. ANSWER: 12 ACCEPT REJECT verifier reviser",
    "Question: how many eggs? The answer is 18. #### 18 debate round previous answers",
] * 20



@pytest.fixture(autouse=True)
def _one_torch_thread():
    """Tiny models gain nothing from intra-op threads, and on a busy 2-core box two spinning
    OpenMP threads per process slow the tests down many-fold; restored after each test."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tiny_tokenizer():
    return train_tokenizer(CORPUS, vocab_size=300)


@pytest.fixture(scope="session")
def tiny_plain_tokenizer():
    """Same tokenizer without a chat template: exercises the documented plain prompt format."""
    return train_tokenizer(CORPUS, vocab_size=300, chat_template=False)


@pytest.fixture()
def tiny_model(tiny_tokenizer):
    return tiny_causal_lm(tiny_tokenizer, seed=0)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tiny_tokenizer) -> Path:
    """A tiny random model and its tokenizer saved in Hugging Face format (the local-path load route)."""
    path = tmp_path_factory.mktemp("tiny-model")
    tiny_causal_lm(tiny_tokenizer, seed=0).save_pretrained(path)
    tiny_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dir_b(tmp_path_factory, tiny_plain_tokenizer) -> Path:
    """A second tiny model of another size, with a tokenizer that has no chat template."""
    path = tmp_path_factory.mktemp("tiny-model-b")
    tiny_causal_lm(tiny_plain_tokenizer, hidden_size=48, num_layers=1, num_heads=2, seed=1).save_pretrained(path)
    tiny_plain_tokenizer.save_pretrained(path)
    return path
