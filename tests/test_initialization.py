"""Weights at initialisation: GPT-2's draw for GPT-2-style blocks, Paper A's for its concat-then-MLP block.

Paper A's block has no residual stream, so GPT-2's small-output init makes its signal vanish layer by layer and
training falls into the constant predictor; Paper A's code draws Xavier-uniform attention projections and keeps
PyTorch's defaults elsewhere. Checked against GPT2LMHeadModel and against `paper_a_reference.py`.
"""

import statistics

import pytest
import torch
from paper_a_reference import ReferenceModel
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForTokenClassification, GPT2Config, GPT2LMHeadModel

from hf_attn.data import algorithmic_dataset

POSITIONS = 9  # Paper A: n = 8 numbers and the scratchpad


def test_gpt2_style_models_draw_each_weight_as_gpt2_does():
    shape = dict(n_layer=4, n_head=4, n_embd=64, vocab_size=500, n_positions=64)
    ours = AutoModelForCausalLM.from_config(
        AutoConfig.for_model("hybrid_gpt2", num_local_heads=0, attend_to_self=True, **shape)
    )
    gpt2 = GPT2LMHeadModel(GPT2Config(**shape))
    theirs = dict(gpt2.named_parameters())
    for name, parameter in ours.named_parameters():
        expected = theirs[name]
        if expected.std() == 0 or expected.numel() < 1000:  # zero biases, LayerNorm gains
            torch.testing.assert_close(parameter, expected)
        else:  # c_proj of attention and MLP scaled by 1 / sqrt(2 * n_layer), the rest normal(0.02)
            assert parameter.std().item() == pytest.approx(expected.std().item(), rel=0.1), name


def paper_a_config(kind: str, **overrides):
    """Paper A's algorithmic model as a user would build it by hand (4 layers, width 64, 2 heads, MLP 64)."""
    heads = {
        "positional": dict(model_type="positional_gpt2", position_embedding_type="none"),
        "standard": dict(model_type="hybrid_gpt2", num_local_heads=0, content_qk_dim=64),
    }[kind]
    return AutoConfig.for_model(
        **heads, n_layer=4, n_embd=64, n_head=2, n_inner=64, n_positions=POSITIONS, block_style="concat_mlp",
        is_causal=False, attend_to_self=True, activation_function="relu", vocab_size=1, numeric_inputs=True,
        num_labels=1, problem_type="regression", **overrides,
    )  # fmt: skip


def signal_at_init(model_fn, seeds=range(6)) -> tuple[list[float], float]:
    """Mean over seeds of each layer's output std, and of |f(x + 1) - f(x)|: does the input still reach the end?"""
    values = algorithmic_dataset("cumulative_median", 64, scale=1.0, seed=0, length=8, low=-2, high=2)
    values = values.with_format("torch")[:]["numeric_values"]
    layer_stds, sensitivities = [], []
    for seed in seeds:
        torch.manual_seed(seed)
        forward = model_fn()
        with torch.no_grad():
            out, layers = forward(values)
            shifted, _ = forward(values + 1)
        layer_stds.append([layer.std().item() for layer in layers])
        sensitivities.append((shifted - out).abs().mean().item())
    return [statistics.fmean(column) for column in zip(*layer_stds, strict=True)], statistics.fmean(sensitivities)


def ours(kind: str, **overrides):
    def build():
        model = AutoModelForTokenClassification.from_config(paper_a_config(kind, **overrides)).eval()

        def forward(values):
            outputs = model(numeric_values=values, output_hidden_states=True)
            return outputs.logits[..., 0], outputs.hidden_states[1:]

        return forward

    return build


def reference(kind: str):
    return lambda: ReferenceModel(positional=kind == "positional", positions=POSITIONS).eval()


@pytest.mark.parametrize("kind", ["positional", "standard"])
def test_paper_a_block_keeps_the_signal_of_paper_a_code_at_init(kind):
    layer_stds, sensitivity = signal_at_init(ours(kind))
    reference_stds, reference_sensitivity = signal_at_init(reference(kind))
    for layer, (std, expected) in enumerate(zip(layer_stds, reference_stds, strict=True)):
        assert expected / 10 < std < expected * 10, f"layer {layer}: std {std:.2e}, Paper A's code {expected:.2e}"
    assert reference_sensitivity / 10 < sensitivity < reference_sensitivity * 10


def test_gpt2_init_on_the_paper_a_block_loses_the_signal():
    """Why `concat_mlp` defaults to Paper A's init: with GPT-2's, the input barely reaches the output."""
    layer_stds, sensitivity = signal_at_init(ours("positional", initialization="gpt2"))
    _, reference_sensitivity = signal_at_init(reference("positional"))
    assert layer_stds[-1] < layer_stds[0] / 100 and sensitivity < reference_sensitivity / 1000


def median_mse_after_a_short_run(config, seed: int) -> tuple[float, float]:
    """Adam 1e-3 for 10 epochs of 2,000 cumulative-median samples (batch 250); returns the in-distribution MSE and
    that of the best input-blind predictor (each position's mean label)."""
    torch.manual_seed(seed)
    model = AutoModelForTokenClassification.from_config(config)
    data = dict(length=8, low=-2.0, high=2.0)
    train = algorithmic_dataset("cumulative_median", 2000, scale=1.0, seed=seed, **data).with_format("torch")[:]
    test = algorithmic_dataset("cumulative_median", 500, scale=1.0, seed=10**6, **data).with_format("torch")[:]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    for _ in range(10):
        for batch in torch.randperm(2000).split(250):
            loss = model(numeric_values=train["numeric_values"][batch], labels=train["labels"][batch]).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        predictions = model(numeric_values=test["numeric_values"]).logits[..., 0]
    labels = test["labels"]
    labelled = ~labels.isnan()
    mse = ((predictions - labels)[labelled] ** 2).mean().item()
    input_blind = ((labels - labels.nanmean(0))[labelled] ** 2).mean().item()
    return mse, input_blind


@pytest.mark.parametrize("kind", ["positional", "standard"])
def test_short_median_runs_leave_the_constant_predictor_for_every_seed(kind):
    for seed in range(3):
        mse, input_blind = median_mse_after_a_short_run(paper_a_config(kind), seed)
        assert mse < 0.25 * input_blind, f"seed {seed}: MSE {mse:.3f}, input-blind predictor {input_blind:.3f}"


def test_loading_keeps_the_saved_weights(tmp_path):
    model = AutoModelForTokenClassification.from_config(paper_a_config("standard")).eval()
    model.save_pretrained(tmp_path)
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path).eval()
    values = torch.randn(3, POSITIONS)
    torch.testing.assert_close(loaded(numeric_values=values).logits, model(numeric_values=values).logits)
