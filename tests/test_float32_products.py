"""benchmarks/float32_products.py: inside `Float32Products`, a product of bfloat16 tensors is computed from float32
copies and rounded back, which PyTorch's own bfloat16 kernel (the reference: float32 sums, bfloat16 result) matches
to the last bit of an entry; everything else runs as it would without it."""

import json

import pytest
import torch
import torch.nn.functional as F
import transformers
from torch.overrides import TorchFunctionMode

from benchmarks import float32_products, ruler_files
from benchmarks import ruler as ruler_benchmark
from benchmarks.float32_products import Float32Products

GPT2 = "../shared/data/gpt2-tokenizer"
HAYSTACK = "../shared/data/wikitext-2-raw"


class Recorder(TorchFunctionMode):
    """The dtypes of the tensors each product reaches it with (entered before Float32Products: it sees that mode's
    calls)."""

    def __init__(self):
        super().__init__()
        self.dtypes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in float32_products.PRODUCTS:
            flat = [*args, *(kwargs or {}).values()]
            self.dtypes.append({value.dtype for value in flat if isinstance(value, torch.Tensor)})
        return func(*args, **(kwargs or {}))


def products(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> dict:
    """Every product Float32Products widens, on a (4, 8, 16) batch, a (16, 8) matrix and a (4, 8, 8) addend."""
    return {
        "linear": lambda: F.linear(a, b.T, c[0, 0]),
        "matmul": lambda: torch.matmul(a, b),
        "Tensor.matmul": lambda: a.matmul(b),
        "@": lambda: a @ b,
        "mm": lambda: torch.mm(a[0], b),
        "Tensor.mm": lambda: a[0].mm(b),
        "bmm": lambda: torch.bmm(a, b.expand(4, 16, 8)),
        "Tensor.bmm": lambda: a.bmm(b.expand(4, 16, 8)),
        "addmm": lambda: torch.addmm(c[0], a[0], b),
        "Tensor.addmm": lambda: c[0].addmm(a[0], b),
        "baddbmm": lambda: torch.baddbmm(c, a, b.expand(4, 16, 8), alpha=0.5),
        "Tensor.baddbmm": lambda: c.baddbmm(a, b.expand(4, 16, 8)),
        "einsum": lambda: torch.einsum("bij,jk->bik", a, b),
    }


def bfloat16_inputs(integers: bool) -> tuple[torch.Tensor, ...]:
    generator = torch.Generator().manual_seed(0)
    shapes = [(4, 8, 16), (16, 8), (4, 8, 8)]
    if integers:  # small integers: every product and sum exact in float32, and the results exact in bfloat16
        return tuple(torch.randint(-3, 4, shape, generator=generator).bfloat16() for shape in shapes)
    return tuple(torch.randn(shape, generator=generator).bfloat16() for shape in shapes)


@pytest.mark.parametrize("name", list(products(*bfloat16_inputs(False))))
def test_bfloat16_products_are_computed_in_float32_and_match_pytorchs_bfloat16_kernel(name):
    for integers in (True, False):
        a, b, c = bfloat16_inputs(integers)
        native = products(a, b, c)[name]()
        recorder = Recorder()
        with recorder, Float32Products():
            widened = products(a, b, c)[name]()
        assert widened.dtype == torch.bfloat16 and widened.shape == native.shape
        assert recorder.dtypes == [{torch.float32}]
        if integers:
            assert torch.equal(widened, native)
        else:  # the sums' order may differ: at most one bfloat16 step apart, most entries the same
            step = torch.finfo(torch.bfloat16).eps * native.float().abs().clamp(min=1e-3)
            assert ((widened.float() - native.float()).abs() <= step).all()
            assert (widened == native).float().mean() > 0.9


def test_other_dtypes_other_calls_and_mixed_dtypes_are_left_as_they_are():
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    recorder = Recorder()
    with recorder, Float32Products():
        assert torch.equal(a @ b, torch.matmul(a, b))  # float32: untouched
        assert torch.equal(torch.matmul(a.double(), b.double()), a.double() @ b.double())
        summed = a.bfloat16() + a.bfloat16()  # not a product
        with pytest.raises(RuntimeError):  # mixed dtypes fail as they would without the mode
            torch.matmul(a.bfloat16(), b)
    assert summed.dtype == torch.bfloat16 and torch.equal(summed, a.bfloat16() + a.bfloat16())
    assert recorder.dtypes == [{torch.float32}] * 2 + [{torch.float64}] * 2 + [{torch.bfloat16, torch.float32}]


def test_a_parameters_float32_copy_is_made_once_and_again_after_it_changes():
    """A weight's copy is kept for the next product (decoding multiplies by every weight at each token), and a
    weight changed in place is widened again: the products stay exact for small integers throughout."""
    a, b, _ = bfloat16_inputs(integers=True)
    linear = torch.nn.Linear(8, 16, bias=False).bfloat16()
    with torch.no_grad():
        linear.weight.copy_(b)
    mode = Float32Products()
    with torch.no_grad():
        with mode:
            first = linear(a.transpose(1, 2))
        assert torch.equal(first, linear(a.transpose(1, 2)))  # PyTorch's bfloat16 kernel, outside the mode
        kept = mode.parameters[id(linear.weight)][2]
        with mode:
            linear(a.transpose(1, 2))
        assert mode.parameters[id(linear.weight)][2] is kept and kept.dtype == torch.float32
        linear.weight.mul_(2)
        with mode:
            changed = linear(a.transpose(1, 2))
        assert torch.equal(changed, 2 * first) and mode.parameters[id(linear.weight)][2] is not kept


def test_a_bfloat16_llama_is_as_far_from_its_float32_logits_as_with_pytorchs_bfloat16_kernels():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2)  # fmt: skip
    model = transformers.LlamaForCausalLM(config).bfloat16().eval()
    ids = torch.randint(0, 128, (2, 24))
    with torch.no_grad():
        native = model(ids).logits.float()
        with Float32Products():
            widened = model(ids).logits.float()
        exact = model.float()(ids).logits
    assert not torch.equal(widened, exact)  # still bfloat16 arithmetic
    error, native_error = (widened - exact).abs().mean(), (native - exact).abs().mean()
    assert native_error / 2 < error < 2 * native_error, (error, native_error)
    assert (widened.argmax(-1) == native.argmax(-1)).float().mean() > 0.9


def test_ruler_run_records_the_products_in_its_settings_and_report(tmp_path):
    argv = ["run", "--quick", "--tokenizer", GPT2, "--haystack-dir", HAYSTACK, "--output-dir", str(tmp_path),
            "--tasks", "niah_single_1", "--ppl-blocks", "0", "--dtype", "bfloat16"]  # fmt: skip
    ruler_benchmark.main([*argv, "--float32-products"])
    folder = tmp_path / "pred" / "unmodified" / "1024"
    settings = json.loads((folder / "niah_single_1.run.json").read_text())["settings"]
    assert settings["dtype"] == "bfloat16" and settings["products"] == "float32"
    assert float32_products.dtype_name(settings) == "bfloat16 (float32 products)"
    assert "bfloat16 (float32 products)" in (tmp_path / "results.md").read_text()
    without = ruler_benchmark.parse_args(argv)
    assert not ruler_files.complete(folder, "niah_single_1", settings | {"products": None}, "run.json")
    assert float32_products.setting(without.float32_products) == {}  # earlier runs' settings: as they were


@pytest.mark.parametrize("mask", ["causal", "bool", "float"])
def test_bfloat16_attention_is_computed_in_float32_and_rounded_once(mask):
    """Within a bfloat16 step of the attention of the same inputs in float64 (PyTorch's bfloat16 kernel also rounds
    the weights to bfloat16 before they multiply the values, which moves it further)."""
    generator = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8, generator=generator).bfloat16() for _ in range(3))
    causal = torch.ones(16, 16, dtype=torch.bool).tril()
    masks = {"causal": {"is_causal": True}, "bool": {"attn_mask": causal},
             "float": {"attn_mask": torch.zeros(16, 16).masked_fill(~causal, -1e4).bfloat16()}}  # fmt: skip
    recorder = Recorder()
    with recorder, Float32Products():
        out = F.scaled_dot_product_attention(q, k, v, **masks[mask])
    widened = {name: value.double() if value.is_floating_point() else value for name, value in masks[mask].items()
               if isinstance(value, torch.Tensor)}  # fmt: skip
    exact = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), **(masks[mask] | widened))
    assert out.dtype == torch.bfloat16
    assert recorder.dtypes == [{torch.float32} | ({torch.bool} if mask == "bool" else set())]
    step = torch.finfo(torch.bfloat16).eps * exact.abs().clamp(min=1e-3)
    assert ((out.double() - exact).abs() <= step).all()
