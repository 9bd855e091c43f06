"""Half precision, as transformers tests every model: each hf_attn type and hybridized families (local heads, sinks,
positional heads), saved in float32 and loaded with `dtype=torch.float16` or `torch.bfloat16`, run eager against SDPA
with and without padding within the tolerances of transformers' `_test_eager_matches_sdpa_inference` on the CPU,
stay near the same weights in float32 (an independent reference), keep each row's outputs under padding, generate the
same tokens eager and SDPA, and train under bfloat16 autocast as in float32."""

import copy

import pytest
import torch
from conftest import tiny_config
from test_hybrid import FAMILIES, VOCAB, tiny
from transformers import AutoModelForCausalLM, Trainer, TrainingArguments
from transformers.testing_utils import set_model_for_less_flaky_test

from hf_attn import hybridize

HALF = {"float16": torch.float16, "bfloat16": torch.bfloat16}
# transformers' CPU tolerances for eager against SDPA, by dtype (atol, rtol).
EAGER_SDPA = {torch.float32: (1e-6, 1e-4), torch.float16: (5e-3, 5e-3), torch.bfloat16: (1e-2, 1e-2)}
# Half precision against float32 logits: a bfloat16 value keeps 8 bits of mantissa, a float16 one 11.
NEAR_FLOAT32 = {torch.float16: 2e-2, torch.bfloat16: 1e-1}
GPT2_LAYOUT = [["global", "local", "positional", "global"], ["positional", "global", "local", "local"]]
# 8 query heads over 2 key/value heads where the family has grouped-query attention: global, local and positional
# heads mixed in a group, a group of local heads alone, a group of positional heads alone.
HYBRID_LAYOUT = [["global", "local", "positional", "global"] + ["local"] * 4,
                 ["positional"] * 4 + ["local", "local", "global", "positional"]]  # fmt: skip
MODELS = ("positional_gpt2", "local_gpt2", "local_gpt2+sinks", "hybrid_gpt2", *(f"hybridized {f}" for f in FAMILIES))


def float32_model(name: str):
    """A float32 model whose logits lie far apart (greedy choices are no near-ties, even in bfloat16)."""
    if name.startswith("hybridized"):
        model = hybridize(tiny(name.split()[1]), head_layout=HYBRID_LAYOUT, local_window=2, sink_tokens=2)
    else:
        model_type, _, sinks = name.partition("+")
        layout = {"head_layout": GPT2_LAYOUT} if model_type == "hybrid_gpt2" else {}
        config = tiny_config(model_type, vocab_size=VOCAB, sink_tokens=2 if sinks else 0, **layout)
        model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        model.get_output_embeddings().weight.mul_(20)
    return model.eval()


def loaded(folder, dtype: torch.dtype, implementation: str):
    """As transformers' test loads it, norms' epsilon set to 1 (`set_model_for_less_flaky_test`): a random model's
    tiny variances would otherwise blow a last bit of difference up."""
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation=implementation).eval()
    set_model_for_less_flaky_test(model)
    return model


def padded_batch(padding_side: str | None, rows: int = 7, length: int = 10):
    """transformers' batch: `rows` rows, the last padded by 2 on `padding_side` (None: no mask at all)."""
    ids = torch.randint(3, VOCAB, (rows, length), generator=torch.Generator().manual_seed(1))
    if padding_side is None:
        return ids, None
    mask = torch.ones_like(ids)
    mask[-1, :2] = 0 if padding_side == "left" else 1
    mask[-1, -2:] = 0 if padding_side == "right" else 1
    return ids, mask


def last_hidden_and_logits(model, ids, mask):
    """Positions counted over real tokens, as `generate` passes them (GPT-2's forward would count padding too)."""
    positions = None if mask is None else (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(ids, attention_mask=mask, position_ids=positions, output_hidden_states=True)
    return out.hidden_states[-1], out.logits


@pytest.fixture(scope="module", params=MODELS)
def saved(request, tmp_path_factory):
    """A model saved in float32, once per model for every dtype."""
    folder = tmp_path_factory.mktemp(request.param.replace(" ", "_").replace("+", "_"))
    float32_model(request.param).save_pretrained(folder)
    return folder


@pytest.mark.parametrize("dtype", [torch.float32, *HALF.values()], ids=["float32", *HALF])
def test_eager_matches_sdpa_and_float32_with_and_without_padding(saved, dtype):
    eager, sdpa = loaded(saved, dtype, "eager"), loaded(saved, dtype, "sdpa")
    reference = loaded(saved, torch.float32, "sdpa")
    assert {p.dtype for p in [*eager.parameters(), *sdpa.parameters()]} == {dtype}
    atol, rtol = EAGER_SDPA[dtype]
    for padding_side in (None, "left", "right"):
        ids, mask = padded_batch(padding_side)
        real = torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()  # padding's rows left aside
        (eager_hidden, eager_logits), (sdpa_hidden, sdpa_logits) = (last_hidden_and_logits(m, ids, mask)
                                                                    for m in (eager, sdpa))  # fmt: skip
        assert eager_hidden.dtype == sdpa_logits.dtype == dtype
        torch.testing.assert_close(eager_hidden[real], sdpa_hidden[real], atol=atol, rtol=rtol)
        _, expected = last_hidden_and_logits(reference, ids, mask)
        if dtype in NEAR_FLOAT32:
            scale = expected[real].abs().max()
            torch.testing.assert_close(sdpa_logits[real].float(), expected[real], atol=NEAR_FLOAT32[dtype] * scale,
                                       rtol=0)  # fmt: skip
        if padding_side is not None:  # the padded row gives what its real tokens give alone, in any dtype
            alone, _ = last_hidden_and_logits(sdpa, ids[-1:, real[-1]], None)
            torch.testing.assert_close(sdpa_hidden[-1, real[-1]], alone[0], atol=atol, rtol=rtol)


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF)
def test_eager_and_sdpa_generate_the_same_tokens(saved, dtype):
    """transformers' `test_eager_matches_sdpa_generate`: greedy from a left-padded batch, the cache each makes."""
    ids, mask = padded_batch("left", rows=3, length=8)
    generate = dict(attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=2)
    eager, sdpa = loaded(saved, dtype, "eager"), loaded(saved, dtype, "sdpa")
    generated = sdpa.generate(ids, **generate)
    assert torch.equal(eager.generate(ids, **generate), generated)
    assert torch.equal(loaded(saved, torch.float32, "sdpa").generate(ids, **generate), generated)


TRAINED = ("positional_gpt2", "local_gpt2+sinks", "hybrid_gpt2", "hybridized llama", "hybridized gpt2")


@pytest.mark.parametrize("name", TRAINED)
def test_bfloat16_autocast_trains_as_float32(name):
    """Under `torch.autocast("cpu", torch.bfloat16)` (what Trainer's `bf16=True` does): gradients finite and along
    float32's, and a few steps of AdamW lower the loss as they do in float32."""
    ids, mask = padded_batch("right", rows=4, length=12)
    labels = ids.masked_fill(mask == 0, -100)
    losses, first_grads = {}, {}
    for precision in ("float32", "bfloat16"):
        torch.manual_seed(0)
        model = float32_model(name).train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        losses[precision] = []
        for _ in range(4):
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bfloat16"):
                loss = model(ids, attention_mask=mask, labels=labels).loss
            loss.backward()
            if precision not in first_grads:
                first_grads[precision] = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
            optimizer.step()
            optimizer.zero_grad()
            losses[precision].append(loss.item())
    assert torch.isfinite(first_grads["bfloat16"]).all()
    assert torch.nn.functional.cosine_similarity(first_grads["bfloat16"].float(), first_grads["float32"], dim=0) > 0.99
    assert losses["bfloat16"][-1] < losses["bfloat16"][0]
    for got, expected in zip(losses["bfloat16"], losses["float32"], strict=True):
        assert got == pytest.approx(expected, rel=0.02)


def test_trainer_bf16_trains_a_hybridized_model(tmp_path):
    """Trainer with `bf16=True` on the CPU (autocast), the usual GPU set-up: the loss falls, weights stay float32."""
    model = float32_model("hybridized llama")
    ids, _ = padded_batch(None, rows=16, length=12)
    data = [{"input_ids": row, "labels": row} for row in ids]
    arguments = TrainingArguments(tmp_path, bf16=True, use_cpu=True, per_device_train_batch_size=8, max_steps=6,
                                  learning_rate=1e-3, logging_steps=1, save_strategy="no")  # fmt: skip
    trainer = Trainer(model, arguments, train_dataset=data)
    trainer.train()
    logged = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(logged) == 6 and logged[-1] < logged[0]
    assert {p.dtype for p in model.parameters()} == {torch.float32}


@pytest.mark.parametrize("dtype", HALF.values(), ids=HALF)
@pytest.mark.parametrize("positional_encoding", ["onehot", "binary", "sinusoidal", "learned"])
def test_a_positional_model_built_in_half_precision_runs_in_it(dtype, positional_encoding):
    """Built with `from_config(dtype=...)` (fixed P, and GPT-2's learned one) or cast with `.to(dtype)`: every
    parameter and P's rows in that dtype, the logits those of the float32 model."""
    config = tiny_config("positional_gpt2", vocab_size=VOCAB, positional_encoding=positional_encoding,
                         position_embedding_type="sinusoidal")  # fmt: skip
    torch.manual_seed(0)
    built = AutoModelForCausalLM.from_config(config, dtype=dtype).eval()
    torch.manual_seed(0)
    reference = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
    ids, _ = padded_batch(None, rows=2, length=9)
    with torch.no_grad():
        expected = reference(ids).logits
        for model in (built, copy.deepcopy(reference).to(dtype)):
            assert {t.dtype for t in [*model.parameters(), *model.buffers()] if t.is_floating_point()} == {dtype}
            logits = model(ids).logits
            assert logits.dtype == dtype
            scale = expected.abs().max()
            torch.testing.assert_close(logits.float(), expected, atol=NEAR_FLOAT32[dtype] * scale, rtol=0)
