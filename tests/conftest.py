import copy
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402

import hf_attn  # noqa: E402, F401  (registers the model types)

MODEL_TYPES = ("positional_gpt2", "local_gpt2", "hybrid_gpt2")


def tiny_config(model_type: str, **overrides):
    """A few-thousand-parameter config of `model_type`; dropout off so outputs are deterministic."""
    from transformers import AutoConfig

    fields = dict(
        n_layer=2,
        n_head=4,
        n_embd=32,
        vocab_size=37,
        n_positions=64,
        local_window=2,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=1,
        pad_token_id=2,
        positional_qk_dim=8,
    )
    fields.update(overrides)
    return AutoConfig.for_model(model_type, **fields)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(scope="session")
def trained_retriever():
    """The model of tests/retrieval_task.py, trained once for every test that scores heads."""
    from retrieval_task import train_retriever

    return train_retriever()


@pytest.fixture
def retriever(trained_retriever):
    """A copy of the trained retriever, all global: tests hybridize it in place."""
    return copy.deepcopy(trained_retriever)
