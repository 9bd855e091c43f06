"""Task heads, numeric inputs, and a few seconds of Trainer training that must lower the loss."""

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from transformers import (
    AutoModel,
    AutoModelForSequenceClassification,
    AutoModelForTokenClassification,
    Trainer,
    TrainingArguments,
)


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_sequence_regression_reads_the_last_real_token(model_type):
    config = tiny_config(model_type, num_labels=1, problem_type="regression")
    model = AutoModelForSequenceClassification.from_config(config).eval()
    alone = torch.randint(3, 37, (1, 6))
    left = torch.cat([torch.full((1, 3), 2), alone], dim=1)
    right = torch.cat([alone, torch.full((1, 3), 2)], dim=1)
    mask_left = torch.tensor([[0] * 3 + [1] * 6])
    with torch.no_grad():
        out = model(alone, labels=torch.tensor([[0.7]]))
        expected = out.logits
        left_out = model(left, attention_mask=mask_left).logits
        right_out = model(right, attention_mask=mask_left.flip(-1)).logits
    torch.testing.assert_close(left_out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(right_out, expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.loss, ((expected - 0.7) ** 2).mean())


def test_sequence_classification_loss_is_cross_entropy():
    model = AutoModelForSequenceClassification.from_config(tiny_config("hybrid_gpt2", num_labels=3)).eval()
    input_ids, labels = torch.randint(3, 37, (4, 5)), torch.tensor([0, 2, 1, 2])
    out = model(input_ids, labels=labels)
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits, labels))


def test_token_regression_ignores_nan_labels():
    config = tiny_config("positional_gpt2", num_labels=1, problem_type="regression")
    model = AutoModelForTokenClassification.from_config(config).eval()
    input_ids = torch.randint(3, 37, (2, 6))
    labels = torch.randn(2, 6)
    labels[:, -1] = float("nan")  # e.g. Paper A's scratchpad position, left out of the loss
    out = model(input_ids, labels=labels)
    expected = ((out.logits[..., 0][:, :-1] - labels[:, :-1]) ** 2).mean()
    torch.testing.assert_close(out.loss, expected)


def test_token_classification_ignores_minus_100():
    model = AutoModelForTokenClassification.from_config(tiny_config("local_gpt2", num_labels=4)).eval()
    input_ids, labels = torch.randint(3, 37, (2, 6)), torch.randint(0, 4, (2, 6))
    labels[0, :2] = -100
    out = model(input_ids, labels=labels)
    kept = labels != -100
    torch.testing.assert_close(out.loss, torch.nn.functional.cross_entropy(out.logits[kept], labels[kept]))


def test_numeric_values_embed_as_value_times_w_plus_b():
    config = tiny_config("positional_gpt2", numeric_inputs=True, numeric_token_id=5)
    model = AutoModel.from_config(config).eval()
    input_ids = torch.tensor([[7, 5, 8, 5]])
    values = torch.tensor([[0.0, 1.5, 0.0, -2.0]])
    w, b = model.wne.weight[:, 0], model.wne.bias
    embeds = model.wte(input_ids).clone()
    embeds[0, 1], embeds[0, 3] = 1.5 * w + b, -2.0 * w + b
    with torch.no_grad():
        expected = model(inputs_embeds=embeds).last_hidden_state
        by_token_id = model(input_ids, numeric_values=values).last_hidden_state
        by_mask = model(input_ids, numeric_values=values, numeric_mask=input_ids == 5).last_hidden_state
    torch.testing.assert_close(by_token_id, expected)
    torch.testing.assert_close(by_mask, expected)
    only_numbers = model(numeric_values=values).last_hidden_state  # no ids: every position is a number
    assert only_numbers.shape == (1, 4, 32)


def test_numeric_values_need_numeric_inputs():
    model = AutoModel.from_config(tiny_config("local_gpt2"))
    with pytest.raises(ValueError, match="numeric_inputs"):
        model(torch.tensor([[3, 4]]), numeric_values=torch.tensor([[1.0, 2.0]]))


def numeric_model(model_type: str):
    config = tiny_config(model_type, numeric_inputs=True, num_labels=1, problem_type="regression")
    return AutoModelForTokenClassification.from_config(config)


def outputs_and_gradients(model, real: torch.Tensor, **inputs) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Logits at the `real` positions and every parameter's gradient of a loss that reads only them."""
    model.zero_grad()
    logits = model(**inputs).logits[real]
    (logits * torch.linspace(-1, 1, logits.numel()).view_as(logits)).sum().backward()
    return logits.detach(), {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


NON_FINITE = (float("nan"), float("inf"), float("-inf"))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
@pytest.mark.parametrize("with_ids", [True, False], ids=["outside_numeric_mask", "at_padding"])
def test_numbers_where_unused_reach_neither_outputs_nor_gradients(model_type, with_ids):
    """NaN and inf where no number is read (outside `numeric_mask`, or padding) give exactly what 0.0 there gives,
    and an optimizer step on them leaves the model finite."""
    model = numeric_model(model_type)
    values = torch.randn(2, 8)
    attention_mask = torch.ones(2, 8, dtype=torch.long)
    attention_mask[1, -3:] = 0  # right padding
    inputs = {"attention_mask": attention_mask}
    if with_ids:
        inputs |= {"input_ids": torch.randint(3, 37, (2, 8)), "numeric_mask": torch.rand(2, 8) < 0.5}
        unused = ~inputs["numeric_mask"] | (attention_mask == 0)
    else:
        unused = attention_mask == 0
    real = attention_mask.bool()
    clean = values.masked_fill(unused, 0.0)
    filler = torch.tensor(NON_FINITE)[torch.arange(values.numel()) % len(NON_FINITE)].view_as(values)
    poisoned = torch.where(unused, filler, clean)
    expected = outputs_and_gradients(model, real, numeric_values=clean, **inputs)
    got = outputs_and_gradients(model, real, numeric_values=poisoned, **inputs)
    torch.testing.assert_close(got, expected)

    torch.optim.SGD(model.parameters(), lr=0.1).step()
    assert all(torch.isfinite(p).all() for p in model.parameters())


@pytest.mark.parametrize("bad_value", NON_FINITE)
def test_non_finite_numbers_where_used_are_refused_before_any_computation(bad_value):
    model = numeric_model("positional_gpt2")
    calls = []
    model.transformer.wne.register_forward_hook(lambda *args: calls.append(args))
    input_ids = torch.randint(3, 37, (2, 6))
    numeric_mask = torch.zeros(2, 6, dtype=torch.bool)
    numeric_mask[1, 2:4] = True
    values = torch.randn(2, 6)
    values[1, 3] = bad_value
    with pytest.raises(ValueError, match=r"`numeric_values` must hold finite numbers.*row 1, position 3"):
        model(input_ids, numeric_values=values, numeric_mask=numeric_mask)
    with pytest.raises(ValueError, match="`numeric_values`"):
        model(numeric_values=values)  # no ids: every position is a number
    assert not calls


def test_numeric_values_are_refused_with_inputs_embeds():
    model = numeric_model("local_gpt2")
    with pytest.raises(ValueError, match="numeric_values.*inputs_embeds"):
        model(inputs_embeds=torch.randn(1, 3, 32), numeric_values=torch.randn(1, 3))


class CumulativeSum(torch.utils.data.Dataset):
    """Paper A's cumulative sum as per-position regression over numbers only."""

    def __init__(self, size: int, length: int = 8, seed: int = 0):
        generator = torch.Generator().manual_seed(seed)
        self.values = torch.rand(size, length, generator=generator) * 4 - 2
        self.labels = self.values.cumsum(-1)

    def __len__(self):
        return len(self.values)

    def __getitem__(self, i):
        return {"numeric_values": self.values[i], "labels": self.labels[i]}


def test_trainer_lowers_the_loss_of_a_positional_regressor(tmp_path):
    config = tiny_config(
        "positional_gpt2",
        numeric_inputs=True,
        num_labels=1,
        problem_type="regression",
        is_causal=False,
        n_positions=8,
        block_style="concat_mlp",
        activation_function="relu",
    )
    model = AutoModelForTokenClassification.from_config(config)
    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=64,
        num_train_epochs=3,
        learning_rate=5e-3,
        report_to="none",
        use_cpu=True,
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    data = CumulativeSum(1024)
    eval_data = CumulativeSum(256, seed=1)
    trainer = Trainer(model=model, args=args, train_dataset=data, eval_dataset=eval_data)
    before = trainer.evaluate()["eval_loss"]
    trainer.train()
    after = trainer.evaluate()["eval_loss"]
    assert after < 0.5 * before, (before, after)


def test_activation_checkpointing_gives_the_same_gradients():
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(
        tiny_config("hybrid_gpt2", head_layout=[["global", "local", "positional", "local"]] * 2)
    )
    model.train()
    input_ids = torch.randint(3, 37, (2, 10))
    model(input_ids, labels=input_ids).loss.backward()
    expected = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.zero_grad()
    model.activation_checkpointing_enable()
    model(input_ids, labels=input_ids).loss.backward()
    for name, p in model.named_parameters():
        torch.testing.assert_close(p.grad, expected[name], msg=name)
