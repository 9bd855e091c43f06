"""The two initializations `config.initialization` chooses: GPT-2's and that of Paper A's code."""

from torch import nn
from transformers import initialization as init

from .configuration_hf_attn import HfAttnConfig
from .layers_hf_attn import Projection


def init_gpt2_projection(module: nn.Module, config: HfAttnConfig) -> None:
    """GPT-2's, for what transformers' `_init_weights` does not know: normal(initializer_range) projections, those
    into the residual stream scaled down by sqrt(2 * n_layer)."""
    if isinstance(module, Projection):
        std = config.initializer_range
        if module.writes_residual:
            std /= (2 * config.n_layer) ** 0.5
        init.normal_(module.weight, mean=0.0, std=std)
        init.zeros_(module.bias)


def init_paper_a(module: nn.Module) -> None:
    """Paper A's code: Xavier-uniform attention projections with zero biases, PyTorch's defaults for the rest.

    Its attention has separate query-key, value and output projections; `c_attn` holds the first two side by side
    (`Projection.parts`), so each part gets the Xavier bound of its own shape.
    """
    if isinstance(module, Projection) and module.in_attention:
        if not getattr(module.weight, "_is_hf_initialized", False):  # column slices would lose the loaded flag
            for part in module.weight.split(module.parts, dim=1):
                bound = (6 / sum(part.shape)) ** 0.5  # Xavier-uniform: fan-in + fan-out
                part.uniform_(-bound, bound)
        init.zeros_(module.bias)
    elif isinstance(module, Projection):  # the MLP: PyTorch's Linear default, U(+-1/sqrt(fan_in)) for both
        bound = module.nx**-0.5
        init.uniform_(module.weight, -bound, bound)
        init.uniform_(module.bias, -bound, bound)
    elif isinstance(module, nn.Linear):
        init.kaiming_uniform_(module.weight, a=5**0.5)  # PyTorch's Linear default, as above
        if module.bias is not None:
            init.uniform_(module.bias, -(module.in_features**-0.5), module.in_features**-0.5)
    elif isinstance(module, nn.Embedding):
        init.normal_(module.weight)  # PyTorch's default: N(0, 1)
    elif isinstance(module, nn.LayerNorm):
        init.ones_(module.weight)
        init.zeros_(module.bias)
