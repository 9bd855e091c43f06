"""Continuous batching (`hf_attn.serving`): transformers' manager, scheduler and generation loop over
`HeadKindPagedCache`. Each request's tokens and log-probabilities equal its own greedy `generate` (an independent
reference: the model's ordinary cache, one request at a time), for each hf_attn type and each hybridized family with
local, sink and positional heads; requests arrive while others decode and one is cancelled; the pages a local head's
window has passed go back to the pool while its request runs; and one cache budget holds more requests than the
unmodified model's."""

import math
import time

import pytest
import torch
from test_half_precision import MODELS, float32_model
from test_hybrid import VOCAB, sliding, tiny
from transformers import ContinuousBatchingConfig, GenerationConfig

from hf_attn import hybridize
from hf_attn.serving.paged_cache import EVERY_TOKEN, SINKS_AND_WINDOW

# Prompts of mixed lengths, several longer than a batch's tokens (their prefill comes in chunks) and than the
# local window (2) with its sinks (2), on pages of 4 tokens.
LENGTHS = (3, 17, 9, 30, 1, 12)
CONFIG = dict(page_size=4, num_blocks=128, max_batch_tokens=16)


def prompts(lengths=LENGTHS, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=generator).tolist() for n in lengths]


def greedy(new_tokens: int) -> GenerationConfig:
    return GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1, pad_token_id=0)


def reference(model, prompt: list[int], new_tokens: int) -> tuple[list[int], list[float]]:
    """The request alone through `generate` and the model's own cache: its tokens and their log-probabilities."""
    out = model.generate(torch.tensor([prompt]), generation_config=greedy(new_tokens), output_scores=True,
                         return_dict_in_generate=True)  # fmt: skip
    tokens = out.sequences[0, len(prompt) :].tolist()
    logprobs = [score[0].float().log_softmax(-1)[t].item() for score, t in zip(out.scores, tokens, strict=True)]
    return tokens, logprobs


def by_prompt(outputs: dict) -> dict[tuple, object]:
    return {tuple(o.prompt_ids): o for o in outputs.values()}


def assert_as_alone(model, outputs: dict, requests: list[list[int]], new_tokens: int) -> None:
    got = by_prompt(outputs)
    for prompt in requests:
        tokens, logprobs = reference(model, prompt, new_tokens)
        output = got[tuple(prompt)]
        assert output.error is None
        assert output.generated_tokens == tokens, f"prompt of {len(prompt)} tokens"
        assert output.logprobs == pytest.approx(logprobs, abs=1e-4)


@pytest.mark.parametrize("name", MODELS)
def test_generate_batch_gives_each_request_its_own_greedy_generate(name):
    model = float32_model(name)
    requests = prompts()
    cb = ContinuousBatchingConfig(**CONFIG, return_logprobs=True)
    outputs = model.generate_batch(requests, greedy(8), continuous_batching_config=cb, progress_bar=False)
    assert len(outputs) == len(requests)
    assert_as_alone(model, outputs, requests, 8)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "gemma3_text"])
def test_a_model_window_that_binds_is_kept_by_the_pages_too(family):
    """The model's own sliding window (6 tokens) over local heads with sinks and global heads: prompts run past it."""
    model = hybridize(sliding(family), head_layout=[["global", "local"] * 4] * 2, local_window=2, sink_tokens=2)
    requests = prompts((14, 5, 21))
    cb = ContinuousBatchingConfig(**CONFIG, return_logprobs=True)
    outputs = model.generate_batch(requests, greedy(10), continuous_batching_config=cb, progress_bar=False)
    assert_as_alone(model, outputs, requests, 10)


def test_generate_with_the_paged_cache_implementation_runs_continuous_batching():
    """`generate(..., cache_implementation="paged")`: transformers' own switch to continuous batching, which returns
    (1, requests, tokens)."""
    model = float32_model("hybridized llama")
    prompt = prompts((11,))[0]
    out = model.generate(torch.tensor([prompt]), generation_config=greedy(6), cache_implementation="paged",
                         continuous_batching_config=ContinuousBatchingConfig(**CONFIG))  # fmt: skip
    assert out[0, 0, len(prompt) :].tolist() == reference(model, prompt, 6)[0]


@pytest.mark.parametrize("name", ["hybridized llama", "hybrid_gpt2"])
def test_requests_arriving_while_others_decode_and_one_cancelled(name):
    model = float32_model(name)
    first, later = prompts((20, 6, 13)), prompts((9, 25, 2), seed=1)
    manager = model.init_continuous_batching(greedy(12), ContinuousBatchingConfig(**CONFIG, return_logprobs=True))
    manager.start()
    try:
        ids = {manager.add_request(p, max_new_tokens=12): p for p in first}
        first_id = next(iter(ids))
        deadline = time.monotonic() + 60
        while not manager.batch_processor or first_id not in manager.batch_processor.scheduler.active_requests:
            assert time.monotonic() < deadline, "the first request never started"
            time.sleep(0.005)
        cancelled = manager.add_request(prompts((18,), seed=2)[0], max_new_tokens=12)
        manager.cancel_request(cancelled)
        ids |= {manager.add_request(p, max_new_tokens=12): p for p in later}
        outputs = {}
        while len(outputs) < len(ids):
            output = manager.get_result(timeout=60)
            assert output is not None, "a request never finished"
            if output.request_id != cancelled and output.is_finished():
                outputs[output.request_id] = output
    finally:
        manager.stop(block=True)
    assert cancelled not in outputs
    assert_as_alone(model, outputs, list(ids.values()), 12)


def held_pages(manager, request_id: str) -> dict[str, int]:
    cache = manager.batch_processor.cache
    return {name: group.held_blocks(request_id) for name, group in cache.cache_allocators.items()}


def test_pages_the_window_has_passed_go_back_to_the_pool_while_the_request_runs():
    """One long request (60 prompt tokens, 40 new, pages of 4): its global heads hold a page per 4 tokens, its local
    heads (window 2, 2 sinks) the sinks' page and the few pages the window spans, at every step."""
    model = hybridize(tiny("llama"), head_layout=[["global"] * 4 + ["local"] * 4] * 2, local_window=2, sink_tokens=2)
    manager = model.init_continuous_batching(greedy(40), ContinuousBatchingConfig(**CONFIG))
    seen = []
    manager.start()
    try:
        request = manager.add_request(prompts((60,))[0], max_new_tokens=40, streaming=True)
        while (output := manager.get_result(request_id=request, timeout=60)) and not output.is_finished():
            seen.append((len(output.generated_tokens), held_pages(manager, request)))
    finally:
        manager.stop(block=True)
    assert len(seen) > 10
    for generated, held in seen:
        assert held[EVERY_TOKEN] >= math.ceil((60 + generated) / 4)
        # the sinks' page, and the window's at most: the 2 tokens before a query and itself span 2 pages
        assert held[SINKS_AND_WINDOW] <= 1 + 2
    cache = manager.batch_processor.cache if manager.batch_processor else None
    assert cache is None or all(g.held_blocks(request) == 0 for g in cache.cache_allocators.values())


def test_the_cache_keeps_what_each_kind_reads_and_counts_blocks_of_the_unmodified_model():
    """Bytes of one block (a page per layer of 4 tokens): global key/value heads keys and values, local ones the
    same in their group, positional-only ones values alone; `num_blocks` buys the unmodified model's bytes."""
    base = tiny("llama")  # 2 layers, 2 key/value heads of 8 dims, 8 query heads
    layout = [["global"] * 4 + ["positional"] * 4, ["local"] * 4 + ["positional"] * 4]
    model = hybridize(base, head_layout=layout, local_window=2, sink_tokens=2)
    manager = model.init_continuous_batching(greedy(2), ContinuousBatchingConfig(**CONFIG))
    processor = manager._create_batch_processor()
    groups = processor.cache.cache_allocators
    floats = 4  # bytes
    # every token: layer 0 a global head (keys and values) and a positional one (values); layer 1 a positional one
    assert groups[EVERY_TOKEN].bytes_per_block == 4 * (8 + 8 + 8 + 8) * floats
    # sinks and window: layer 1's local head, keys and values
    assert groups[SINKS_AND_WINDOW].bytes_per_block == 4 * (8 + 8) * floats
    unmodified_block = 2 * 2 * 2 * 8 * 4 * floats  # layers x heads x (keys, values) x dims x tokens
    assert processor.cache.num_blocks == CONFIG["num_blocks"]
    assert processor.cache.cache_tensor.numel() >= CONFIG["num_blocks"] * unmodified_block


def most_decoding_at_once(model, requests: list[list[int]], new_tokens: int, num_blocks: int) -> int:
    """The largest number of requests the scheduler held at once, on a cache of `num_blocks` blocks."""
    manager = model.init_continuous_batching(greedy(new_tokens), ContinuousBatchingConfig(
        page_size=4, num_blocks=num_blocks, max_batch_tokens=64))  # fmt: skip
    manager.start()
    most, finished = 0, 0
    try:
        for p in requests:
            manager.add_request(p, max_new_tokens=new_tokens)
        while finished < len(requests):
            output = manager.get_result(timeout=0.001)
            finished += output is not None and output.is_finished()
            if manager.batch_processor is not None:
                most = max(most, len(manager.batch_processor.scheduler.active_requests))
    finally:
        manager.stop(block=True)
    return most


def test_one_cache_budget_holds_more_requests_when_half_the_heads_are_local():
    base = tiny("llama")
    hybrid = hybridize(tiny("llama"), num_local_heads=4, local_window=2, sink_tokens=2)
    requests = prompts((60,) * 8)  # 68 tokens each with the new ones: 17 blocks of the unmodified model's
    unmodified = most_decoding_at_once(base, requests, 8, num_blocks=48)
    hybridized = most_decoding_at_once(hybrid, requests, 8, num_blocks=48)
    assert hybridized >= 1.5 * unmodified, (hybridized, unmodified)


def test_requests_the_cache_cannot_hold_wait_or_restart_and_still_give_their_own_tokens():
    """A budget of 24 blocks of 4 tokens under 6 requests of 30-60 tokens that grow by 12: the scheduler holds some
    back and takes the cache from others (transformers' soft reset, the request recomputed later)."""
    model = float32_model("hybridized llama")
    requests = prompts((30, 60, 45, 33, 52, 40))
    cb = ContinuousBatchingConfig(page_size=4, num_blocks=24, max_batch_tokens=32, return_logprobs=True)
    outputs = model.generate_batch(requests, greedy(12), continuous_batching_config=cb, progress_bar=False)
    assert_as_alone(model, outputs, requests, 12)


def test_what_continuous_batching_cannot_do_is_refused_by_name():
    model = float32_model("hybridized llama")
    config = greedy(4)
    config.num_return_sequences = 2
    with pytest.raises(ValueError, match="num_return_sequences"):
        model.init_continuous_batching(config, ContinuousBatchingConfig(**CONFIG))
    with pytest.raises(ValueError, match="cpu_offload_space"):
        model.init_continuous_batching(greedy(4), ContinuousBatchingConfig(**CONFIG, cpu_offload_space=1.0))
    bidirectional = float32_model("local_gpt2")
    bidirectional.config.is_causal = False
    with pytest.raises(ValueError, match="is_causal"):
        bidirectional.init_continuous_batching(greedy(4), ContinuousBatchingConfig(**CONFIG))
