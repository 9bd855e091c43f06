"""The whole model is one graph: `torch.compile(fullgraph=True)` for training and inference, with and without a mask,
and `torch.export`. Nothing in `forward` reads a tensor on the host there (bad input is refused eagerly instead)."""

import pytest
import torch
from conftest import tiny_config
from transformers import AutoModel, AutoModelForCausalLM

MIXED = [["global", "local", "positional", "positional"], ["positional", "global", "local", "global"]]
VARIANTS = {
    "positional_gpt2": ("positional_gpt2", {}),
    "local_gpt2": ("local_gpt2", {}),
    "mixed": ("hybrid_gpt2", {"head_layout": MIXED}),
    "mixed_rope_wide_window": (
        "hybrid_gpt2",
        {"head_layout": MIXED, "position_embedding_type": "rope", "local_window": 16},  # the chunked local kernel
    ),
}


def model_of(variant: str, auto):
    model_type, overrides = VARIANTS[variant]
    return auto.from_config(tiny_config(model_type, **overrides))


def batch(masked: bool) -> dict:
    input_ids = torch.randint(3, 37, (2, 40))
    if not masked:
        return {"input_ids": input_ids}
    attention_mask = torch.ones_like(input_ids)
    attention_mask[0, :5] = 0  # left padding
    attention_mask[1, -3:] = 0  # right padding
    return {"input_ids": input_ids, "attention_mask": attention_mask}


def gradients(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
def test_training_step_compiles_as_one_graph(variant, masked):
    model = model_of(variant, AutoModelForCausalLM).train()
    inputs = batch(masked)
    model(**inputs, labels=inputs["input_ids"]).loss.backward()
    expected = gradients(model)
    model.zero_grad()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")  # traces the backward too
    compiled(**inputs, labels=inputs["input_ids"]).loss.backward()
    got = gradients(model)
    assert got.keys() == expected.keys()
    for name in expected:
        torch.testing.assert_close(got[name], expected[name], atol=1e-5, rtol=1e-4, msg=name)


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("auto", [AutoModel, AutoModelForCausalLM], ids=["base", "lm_head"])
@pytest.mark.parametrize("masked", [False, True], ids=["no_mask", "mask"])
def test_inference_compiles_as_one_graph_and_exports(variant, auto, masked):
    model = model_of(variant, auto).eval()
    inputs = batch(masked)
    with torch.no_grad():
        expected = model(**inputs, use_cache=False)[0]
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend="eager")
        torch.testing.assert_close(compiled(**inputs, use_cache=False)[0], expected, atol=1e-5, rtol=1e-5)
    args = (inputs["input_ids"],)
    kwargs = {"use_cache": False} | ({"attention_mask": inputs["attention_mask"]} if masked else {})
    exported = torch.export.export(model, args, kwargs)
    with torch.no_grad():
        torch.testing.assert_close(exported.module()(*args, **kwargs)[0], expected, atol=1e-5, rtol=1e-5)


def test_bad_input_is_still_refused_eagerly():
    model = model_of("mixed", AutoModelForCausalLM).eval()
    with pytest.raises(ValueError, match="input_ids"):
        model(torch.tensor([[3, 99]]))
    with pytest.raises(ValueError, match="n_positions"):
        model(torch.tensor([[3, 4]]), position_ids=torch.tensor([[0, 64]]))


class HostReads(torch.overrides.TorchFunctionMode):
    """Records every call that brings a tensor's value to the host (a sync with an accelerator)."""

    READS = {"__bool__", "__int__", "__index__", "__float__", "item", "tolist", "nonzero", "equal"}

    def __init__(self):
        super().__init__()
        self.reads = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in self.READS:
            self.reads.append(func.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "extra",
    [{}, {"attention_mask": "left_padded"}, {"position_ids": "packed"}],
    ids=["plain", "mask", "packed"],
)
def test_an_eager_training_forward_reads_the_device_once(extra):
    """Every question about the inputs' values (bad ids, padding, positions, packed documents) is read in one go."""
    model = model_of("mixed", AutoModelForCausalLM).train()
    input_ids = torch.randint(3, 37, (2, 9))
    inputs = {"input_ids": input_ids, "labels": input_ids}
    if "attention_mask" in extra:
        inputs["attention_mask"] = torch.ones_like(input_ids)
        inputs["attention_mask"][0, :2] = 0
    if "position_ids" in extra:
        inputs["position_ids"] = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1]] * 2)
    with HostReads() as recorded:
        model(**inputs)
    assert recorded.reads == ["tolist"]
