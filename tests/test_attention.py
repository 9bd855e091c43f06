"""Every head-kind kernel against the position-by-position reference in `naive.py`."""

import itertools

import pytest
import torch
from naive import naive_attention

from hf_attn.attention_hf_attn import (
    Visibility,
    fused_positional_attention,
    global_attention,
    local_attention_by_chunks,
    local_attention_by_offsets,
    positional_attention,
    positional_attention_with_weights,
    shared_weights_pay_off,
    shared_weights_positional_attention,
)

B, H, T, D = 2, 3, 13, 8  # T not a multiple of the chunk size, to exercise the ragged last chunk


def local_weights_as_matrix(weights: torch.Tensor, offsets: list[int], num_keys: int) -> torch.Tensor:
    """The offsets kernel's (B, H, T, n) weights scattered into the (B, H, T, S) matrix the reference gives."""
    num_queries = weights.shape[-2]
    matrix = weights.new_zeros(*weights.shape[:-1], num_keys)
    query_key_index = torch.arange(num_queries) + num_keys - num_queries
    for j, offset in enumerate(offsets):
        key_index = query_key_index - offset
        inside = (key_index >= 0) & (key_index < num_keys)
        matrix[..., inside, key_index[inside]] = weights[..., inside, j]
    return matrix


def qkv(num_keys=T, num_queries=T, dtype=torch.float32, qk_dim=D):
    q = torch.randn(B, H, num_queries, qk_dim, dtype=dtype, requires_grad=True)
    k = torch.randn(B, H, num_keys, qk_dim, dtype=dtype, requires_grad=True)
    v = torch.randn(B, H, num_keys, D, dtype=dtype, requires_grad=True)
    return q, k, v


def padding(kind: str, num_keys=T):
    """Left padding on sample 0 (as `generate` makes), right padding on sample 1, or none."""
    if kind == "none":
        return None
    mask = torch.ones(B, num_keys, dtype=torch.bool)
    mask[0, :4] = False
    mask[1, -3:] = False
    return mask


def local_kernels():
    return {
        "offsets": lambda *a: local_attention_by_offsets(*a)[0],
        "chunks": local_attention_by_chunks,
    }


GRID = list(itertools.product([True, False], [True, False], ["none", "padded"]))  # causal, self, padding


@pytest.mark.parametrize("is_causal,attend_to_self,pad", GRID)
def test_global_matches_reference(is_causal, attend_to_self, pad):
    q, k, v = qkv()
    key_mask = padding(pad)
    visibility = Visibility(is_causal, attend_to_self)
    assert_matches_reference(
        lambda q, k, v: global_attention(q, k, v, visibility, key_mask, scale=D**-0.5),
        q,
        k,
        v,
        is_causal=is_causal,
        attend_to_self=attend_to_self,
        key_mask=key_mask,
    )


@pytest.mark.parametrize("kernel", ["offsets", "chunks"])
@pytest.mark.parametrize("local_window", [1, 2, 5])
@pytest.mark.parametrize("is_causal,attend_to_self,pad", GRID)
def test_local_matches_reference(kernel, local_window, is_causal, attend_to_self, pad):
    q, k, v = qkv()
    key_mask = padding(pad)
    visibility = Visibility(is_causal, attend_to_self, local_window)
    assert_matches_reference(
        lambda q, k, v: local_kernels()[kernel](q, k, v, visibility, key_mask, D**-0.5),
        q,
        k,
        v,
        is_causal=is_causal,
        attend_to_self=attend_to_self,
        local_window=local_window,
        key_mask=key_mask,
    )


CONTENT_KERNELS = {
    "global": global_attention,
    "offsets": lambda *a: local_attention_by_offsets(*a)[0],
    "chunks": local_attention_by_chunks,
}


@pytest.mark.parametrize("kernel", list(CONTENT_KERNELS))
@pytest.mark.parametrize("qk_dim", [5, 20])  # narrower (odd) and wider queries and keys than the values' D = 8
@pytest.mark.parametrize("is_causal,attend_to_self,pad", GRID)
def test_queries_and_keys_of_another_width_than_values(kernel, qk_dim, is_causal, attend_to_self, pad):
    """Paper A's standard heads: queries and keys as wide as the model, values a head's share of it."""
    q, k, v = qkv(qk_dim=qk_dim)
    key_mask = padding(pad)
    window = None if kernel == "global" else 2
    visibility = Visibility(is_causal, attend_to_self, window)
    assert_matches_reference(
        lambda q, k, v: CONTENT_KERNELS[kernel](q, k, v, visibility, key_mask, qk_dim**-0.5),
        q,
        k,
        v,
        is_causal=is_causal,
        attend_to_self=attend_to_self,
        local_window=window,
        key_mask=key_mask,
    )


def test_chunk_kernel_with_window_larger_than_chunk():
    """k = 40 > the 32-query minimum chunk: chunks grow to k and still see exactly k keys back."""
    q, k, v = qkv(num_keys=100, num_queries=100)
    out = local_attention_by_chunks(q, k, v, Visibility(True, False, 40), None, D**-0.5)
    expected, _ = naive_attention(q, k, v, True, False, 40)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("local_window", [1, 3])
@pytest.mark.parametrize("attend_to_self", [True, False])
def test_local_offsets_with_cached_keys(local_window, attend_to_self):
    """Queries are the last T of S keys (cached decoding): query i sits at key i + S - T."""
    q, k, v = qkv(num_keys=7, num_queries=2)
    key_mask = torch.ones(B, 7, dtype=torch.bool)
    key_mask[0, :5] = False  # sample 0 has one real past token
    visibility = Visibility(True, attend_to_self, local_window)
    out, weights, offsets = local_attention_by_offsets(q, k, v, visibility, key_mask, D**-0.5)
    expected, expected_weights = naive_attention(q, k, v, True, attend_to_self, local_window, key_mask)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(
        local_weights_as_matrix(weights, offsets, 7).double(), expected_weights, atol=1e-6, rtol=1e-5
    )


POSITIONAL_ROUTES = {
    "shared_weights": shared_weights_positional_attention,
    "fused": fused_positional_attention,
    "auto": positional_attention,
}


@pytest.mark.parametrize("route", POSITIONAL_ROUTES)
@pytest.mark.parametrize("per_sample", [False, True], ids=["shared_positions", "positions_per_sample"])
@pytest.mark.parametrize("is_causal,attend_to_self,pad", GRID)
def test_positional_routes_match_reference(route, per_sample, is_causal, attend_to_self, pad):
    """Positional heads are content attention whose queries and keys are P Wq and P Wk: one row for the batch, or
    one per sample when left padding shifts positions. Outputs and gradients (summed over the batch into the shared
    queries and keys) against the reference, for every route."""
    key_mask = padding(pad)
    rows = B if per_sample else 1
    pq, pk = (torch.randn(rows, H, T, 5, requires_grad=True) for _ in range(2))
    _, _, v = qkv()
    visibility = Visibility(is_causal, attend_to_self)
    assert_matches_reference(
        lambda q, k, v: POSITIONAL_ROUTES[route](q, k, v, visibility, key_mask, 5**-0.5),
        pq, pk, v, is_causal=is_causal, attend_to_self=attend_to_self, key_mask=key_mask,
    )  # fmt: skip


@pytest.mark.parametrize("is_causal,attend_to_self,pad", GRID)
def test_positional_weights_match_reference(is_causal, attend_to_self, pad):
    key_mask = padding(pad)
    pq, pk = torch.randn(1, H, T, 5), torch.randn(1, H, T, 5)
    _, _, v = qkv()
    visibility = Visibility(is_causal, attend_to_self)
    out, weights = positional_attention_with_weights(pq, pk, v, visibility, key_mask, 5**-0.5)
    expected, expected_weights = naive_attention(
        pq.expand(B, -1, -1, -1), pk.expand(B, -1, -1, -1), v, is_causal, attend_to_self, key_mask=key_mask
    )
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(weights.expand(B, -1, -1, -1).double(), expected_weights, atol=1e-6, rtol=1e-5)
    if key_mask is None:
        assert weights.shape[0] == 1, "without padding the weights are one tensor for the whole batch"


@pytest.mark.parametrize("route", POSITIONAL_ROUTES)
def test_positional_routes_decode_against_the_cache(route):
    """A few queries at the end of a longer run of keys (decoding with a cache), left padding included."""
    key_mask = padding("padded", num_keys=T)
    pq, pk = torch.randn(1, H, 2, 5), torch.randn(1, H, T, 5)
    v = torch.randn(B, H, T, D)
    out = POSITIONAL_ROUTES[route](pq, pk, v, Visibility(True, False), key_mask, 5**-0.5)
    expected, _ = naive_attention(pq.expand(B, -1, -1, -1), pk.expand(B, -1, -1, -1), v, True, False, key_mask=key_mask)
    torch.testing.assert_close(out.double(), expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("route", ["shared_weights", "fused"])
def test_positional_dropout_keeps_the_expected_output(route):
    """Dropout per sample: the mean over many draws is the output without dropout."""
    pq, pk = torch.randn(1, 1, 6, 5), torch.randn(1, 1, 6, 5)
    v = torch.randn(4000, 1, 6, D)
    visibility = Visibility(True, True)
    clean = POSITIONAL_ROUTES[route](pq, pk, v[:1], visibility, None, 5**-0.5)
    dropped = POSITIONAL_ROUTES[route](pq, pk, v, visibility, None, 5**-0.5, dropout=0.3)
    assert not torch.allclose(dropped[0], clean[0]), "dropout must change a sample's output"
    samples = POSITIONAL_ROUTES[route](pq, pk, v[:1].expand(4000, -1, -1, -1), visibility, None, 5**-0.5, 0.3)
    torch.testing.assert_close(samples.mean(0), clean[0], atol=0.08, rtol=0)


def test_shared_weights_chosen_for_large_batches_of_short_sequences():
    """The auto route's rule, as measured: Paper A's batch 1000 at T = 9 shares; one long sequence fuses."""

    def prefers_shared(batch, length):
        pq = torch.empty(1, 8, length, 1)
        return shared_weights_pay_off(pq, torch.empty(1, 8, length, 1), torch.empty(batch, 8, length, 1))

    assert prefers_shared(1000, 9) and prefers_shared(64, 64) and prefers_shared(8, 512)
    assert not prefers_shared(1, 1024) and not prefers_shared(4, 1024) and not prefers_shared(1, 256)
    assert not prefers_shared(64, 2048), "8 x 2048 x 2048 weights exceed the memory cap"


@pytest.mark.parametrize("kernel", ["offsets", "chunks"])
def test_strict_first_row_is_zero_without_nan(kernel):
    q, k, v = qkv()
    out = local_kernels()[kernel](q, k, v, Visibility(True, False, 1), padding("padded"), D**-0.5)
    out.sum().backward()
    assert torch.equal(out[:, :, 0], torch.zeros_like(out[:, :, 0]))
    assert torch.equal(out[0, :, :5], torch.zeros_like(out[0, :, :5])), "first real token of a left-padded row"
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v))


def bf16_kernels():
    """Every fast path, as (q, k, v, key_mask) -> output."""
    scale = D**-0.5
    strict_2_local = Visibility(True, False, 2)
    return {
        "offsets": lambda q, k, v, m: local_attention_by_offsets(q, k, v, strict_2_local, m, scale)[0],
        "chunks": lambda q, k, v, m: local_attention_by_chunks(q, k, v, strict_2_local, m, scale),
        "global": lambda q, k, v, m: global_attention(q, k, v, Visibility(True, False), m, scale),
        # q, k of sample 0 stand in for P Wq, P Wk
        "positional": lambda q, k, v, m: shared_weights_positional_attention(
            q[:1], k[:1], v, Visibility(True, True), m, scale
        ),
        "positional fused": lambda q, k, v, m: fused_positional_attention(
            q[:1], k[:1], v, Visibility(True, True), m, scale
        ),
    }


@pytest.mark.parametrize("kernel", ["offsets", "chunks", "global", "positional", "positional fused"])
@pytest.mark.parametrize("pad", ["none", "padded"])
def test_bf16_close_to_fp32(kernel, pad):
    """bf16 outputs and gradients within bf16's precision of the same kernel in fp32."""
    q, k, v = qkv()
    attend = bf16_kernels()[kernel]
    probe = torch.randn(B, H, T, D)
    expected = torch.autograd.grad((attend(q, k, v, padding(pad)) * probe).sum(), (q, k, v), allow_unused=True)
    low = [t.detach().bfloat16().requires_grad_() for t in (q, k, v)]
    out = attend(*low, padding(pad))
    grads = torch.autograd.grad((out.float() * probe).sum(), low, allow_unused=True)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), attend(q, k, v, padding(pad)), atol=3e-2, rtol=3e-2)
    for grad, expected_grad in zip(grads, expected, strict=True):
        if expected_grad is not None:
            assert grad.dtype == torch.bfloat16
            torch.testing.assert_close(grad.float(), expected_grad, atol=6e-2, rtol=6e-2)


def assert_matches_reference(attend, q, k, v, **reference_kwargs):
    """Output and gradients (of a random projection of the output) agree with `naive_attention` in float64. Queries
    and keys with a batch of 1 (positional heads') are shared by every sample: their gradient is summed over them."""
    out = attend(q, k, v)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    batch = v.shape[0]
    expected, _ = naive_attention(q64.expand(batch, -1, -1, -1), k64.expand(batch, -1, -1, -1), v64, **reference_kwargs)
    torch.testing.assert_close(out.double(), expected.detach(), atol=1e-5, rtol=1e-5)
    probe = torch.randn_like(expected)
    grads = torch.autograd.grad((out.double() * probe).sum(), (q, k, v))
    expected_grads = torch.autograd.grad((expected * probe).sum(), (q64, k64, v64))
    for grad, expected_grad in zip(grads, expected_grads, strict=True):
        torch.testing.assert_close(grad.double(), expected_grad, atol=1e-4, rtol=1e-4)
