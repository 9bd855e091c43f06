"""bfloat16 matrix products and attention computed in float32, for CPUs without bfloat16 units.

A bfloat16 product on hardware built for it (Intel AMX through oneDNN, NVIDIA tensor cores through cuBLAS) reads
bfloat16 inputs, sums in float32 and rounds the result to bfloat16. On a CPU with AVX2 alone (AMD Zen 3, older
Intel parts) PyTorch computes the same thing 6-8x slower than a float32 product of the same shape (SmolLM2-135M, one
thread, a 1,024-token prefill: 28.7 s in bfloat16, 4.7 s in float32). Inside `Float32Products`, a product whose
tensors are all bfloat16 has them widened to float32 (exactly), multiplied in float32 and rounded back to bfloat16:
the same quantity at float32's speed, its sums accumulated in another order, so that the last bit of some entries
may differ, as between two machines. Attention (`F.scaled_dot_product_attention`) likewise: one decoding step of 5
sequences over a 4,096-token cache took 36 ms a layer in bfloat16 against 6.5 ms in float32; a fused bfloat16 kernel
also keeps the scores and their softmax in float32, but rounds the weights to bfloat16 before they multiply the
values, which the float32 computation does not (a difference of the order of bfloat16's rounding). Torch alone:
benchmarks/kvpress/run_presses.py, which runs without hf_attn, imports it too.
"""

import contextlib
import weakref

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

PRODUCTS = frozenset({
    F.linear, torch.matmul, torch.Tensor.matmul, torch.Tensor.__matmul__, torch.mm, torch.Tensor.mm,
    torch.bmm, torch.Tensor.bmm, torch.addmm, torch.Tensor.addmm, torch.baddbmm, torch.Tensor.baddbmm,
    torch.einsum, F.scaled_dot_product_attention,
})  # fmt: skip


class Float32Products(TorchFunctionMode):
    """Within it, products (and attention) of bfloat16 tensors are computed in float32 and rounded to bfloat16; every
    other call (other dtypes, mixed floating dtypes, which still fail as they would) runs as it is.

    A parameter's float32 copy is made once and kept while the parameter is unchanged (its `_version`), at the cost
    of the model's weights once more in float32: decoding one token multiplies by every weight, and widening them
    all again at each token took half the step (`python -m benchmarks.float32_products_speed`: SmolLM2-135M, one
    thread, one sequence over 2,048 tokens, a RULER row running beside: 0.237 s a token, 0.111 s with the copies
    kept, the same tokens)."""

    def __init__(self):
        super().__init__()
        self.parameters: dict[int, tuple[weakref.ref, int, torch.Tensor]] = {}  # id -> (parameter, version, copy)

    def widened(self, value):
        if not (isinstance(value, torch.Tensor) and value.is_floating_point()):
            return value
        if not isinstance(value, torch.nn.Parameter):
            return value.float()
        kept = self.parameters.get(id(value))
        if kept is None or kept[0]() is not value or kept[1] != value._version:
            kept = self.parameters[id(value)] = (weakref.ref(value), value._version, value.float())
        return kept[2]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func not in PRODUCTS:  # first: every other call of the model passes through here
            return func(*args, **kwargs)
        floats = [v for v in (*args, *kwargs.values()) if isinstance(v, torch.Tensor) and v.is_floating_point()]
        if not floats or any(tensor.dtype != torch.bfloat16 for tensor in floats):
            return func(*args, **kwargs)
        result = func(*map(self.widened, args), **{name: self.widened(value) for name, value in kwargs.items()})
        return result.to(torch.bfloat16)


HELP = ("bfloat16: products and attention computed in float32, rounded back (benchmarks/float32_products.py: the same "
        "quantity, about 6x faster on CPUs without bfloat16 units)")  # fmt: skip


def argument_problems(enabled: bool, dtype: str) -> list[str]:
    """The runners' check of `--float32-products`."""
    if enabled and dtype != "bfloat16":
        return [f"--float32-products needs --dtype bfloat16 (its products are bfloat16's), got {dtype}"]
    return []


def setting(enabled: bool) -> dict:
    """What a run's settings record of it: nothing when off, so that earlier runs' records stay complete."""
    return {"products": "float32"} if enabled else {}


def dtype_name(settings: dict) -> str:
    """A run's dtype as its settings give it, with its products where they were float32's."""
    return settings["dtype"] + (f" ({settings['products']} products)" if "products" in settings else "")


def products(enabled: bool) -> TorchFunctionMode | contextlib.AbstractContextManager:
    return Float32Products() if enabled else contextlib.nullcontext()
