"""A task with one known retrieval head, for the tests of the head scores (`select_heads`, `gate_scores`): a key, random
fillers, the separator, the key again. Predicting the last token needs the first, 14 back."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel

from hf_attn import hybridize

KEYS, FILLERS, LENGTH = 8, 8, 16  # tokens 0-7 are keys, 8-15 fillers, 16 the separator
SEPARATOR = KEYS + FILLERS


def retrieval_rows(num_rows: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randint(KEYS, KEYS + FILLERS, (num_rows, LENGTH), generator=generator)
    rows[:, 0] = torch.randint(0, KEYS, (num_rows,), generator=generator)
    rows[:, -2], rows[:, -1] = SEPARATOR, rows[:, 0]
    return rows


def train_retriever() -> GPT2LMHeadModel:
    """A 1-layer, 4-head GPT-2 trained on the retrieval rows with heads 1-3 2-local, so that only head 0 can learn to
    retrieve; then made all global again: a "pretrained" model whose one retrieval head is known."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_head=4, n_embd=32, vocab_size=SEPARATOR + 1, n_positions=LENGTH,
                                       bos_token_id=None, eos_token_id=None))  # fmt: skip
    hybridize(model, head_layout=[["global", "local", "local", "local"]], local_window=2)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for step in range(80):
        rows = retrieval_rows(64, seed=step)
        only_the_answer = torch.full_like(rows, -100)
        only_the_answer[:, -1] = rows[:, -1]  # the fillers are noise: their loss would drown the answer's
        loss = model(rows, labels=only_the_answer).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return hybridize(model.eval(), local_window=2)  # all global
