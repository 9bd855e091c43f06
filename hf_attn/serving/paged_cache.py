"""A paged cache that keeps, per key/value head, what its kind of head reads: transformers' `PagedAttentionCache`
(its pool of sectors and blocks, its memory sizing, the scheduler's calls) with two groups of pages of our own.

transformers groups whole layers by type (`full_attention`, `sliding_attention`) and gives each layer one number of
key/value heads. A hybridized layer mixes kinds, so here each layer puts each of its key/value heads in one of the
two groups transformers' batch inputs know by name:

- `full_attention` (`EVERY_TOKEN`): every token of the heads some global query head reads, keys and values, and of
  the heads only positional heads read, values only (their weights come from positions);
- `sliding_attention` (`SINKS_AND_WINDOW`): the first `sinks` tokens and the last `window` of the heads only local
  heads read (and of every head in a layer the model's own architecture windows). A page the window has passed goes
  back to the pool while the request runs; the pages of the sinks stay.

A block is one page per layer, and a page holds only the heads its layer keeps in that group, so pages differ in
size from layer to layer. The indices the batch carries are slots: block id * page size + offset in the page.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil, lcm

import torch
from transformers.generation.continuous_batching.cache import PagedAttentionCache, PagedAttentionMemoryHandler
from transformers.generation.continuous_batching.cache_allocators import (
    FULL_ATTENTION,
    SLIDING_ATTENTION,
    CacheAllocator,
    CachePool,
)
from transformers.generation.continuous_batching.cache_allocators.cache_allocator import BlockLedger

EVERY_TOKEN, SINKS_AND_WINDOW = FULL_ATTENTION, SLIDING_ATTENTION


@dataclass(frozen=True)
class HeadsKept:
    """Of one layer, in one group: the key/value heads whose keys it keeps, and those whose values it keeps."""

    key_heads: tuple[int, ...]
    value_heads: tuple[int, ...]


@dataclass(frozen=True)
class CachePlan:
    """What every layer keeps in each group, the widths of keys and values, and the sinks and window the
    `SINKS_AND_WINDOW` group keeps for every request (the largest any of its layers reads)."""

    layers: dict[int, dict[str, HeadsKept]]
    key_dim: int
    value_dim: int
    sinks: int
    window: int
    original_bytes_per_token: int  # the unmodified model's cache, every layer: what `num_blocks` counts in

    def group_layers(self, group: str) -> dict[int, HeadsKept]:
        return {layer: kept[group] for layer, kept in self.layers.items() if group in kept}


class PageGroup(CacheAllocator):
    """One group's pages: its layers' keys and values by slot, and each request's pages. Keeps every token
    (`window=None`) or the first `sinks` and the last `window`, freeing the pages the window leaves behind."""

    supports_block_sharing = False  # a window's pages change hands: nothing is shared between requests
    supports_block_table = False  # no decode fast path: its kernels read one page size and one head count
    rows_per_token = 1

    def __init__(self, index: int, group: str, layers: dict[int, HeadsKept], plan: CachePlan, page_size: int,
                 dtype: torch.dtype):  # fmt: skip
        self.index, self.layer_type, self.layers, self.dtype = index, group, layers, dtype
        self.window = plan.window if group == SINKS_AND_WINDOW else None
        self.sinks = plan.sinks if group == SINKS_AND_WINDOW else 0
        self.layer_indices = list(layers)
        self.tokens_per_page = page_size
        # Elements of one token of each layer, and where each layer's page starts in a block
        self.token_width = {i: len(k.key_heads) * plan.key_dim + len(k.value_heads) * plan.value_dim
                            for i, k in layers.items()}  # fmt: skip
        self.page_start, start = {}, 0
        for i, width in self.token_width.items():
            self.page_start[i], start = start, start + page_size * width
        self.block_numel = start
        self.key_dim, self.value_dim = plan.key_dim, plan.value_dim
        self.pages_per_block = len(layers)
        self.tokens_per_block = page_size * self.pages_per_block
        self.bytes_per_block = self.block_numel * dtype.itemsize
        self.bytes_per_page = self.bytes_per_block  # a block's pages differ in size: a block is the unit here
        self.block_physical_stride = page_size
        self.block_table: dict[str, list[int | None]] = {}  # per request, per page of its tokens: its block
        self.use_block_sharing = False
        self.ledger = BlockLedger()

    def register_cache_tensor(self, bytes_per_sector: int, non_trash_bytes: int, cache_tensor: torch.Tensor,
                              pool: CachePool) -> None:  # fmt: skip
        self.blocks_per_sector = bytes_per_sector // self.bytes_per_block
        self.num_blocks = non_trash_bytes // self.bytes_per_block
        self.num_pages = self.num_blocks * self.pages_per_block
        self.pool = pool
        pool.set_blocks_per_sector(self.index, self.blocks_per_sector)
        total_blocks = cache_tensor.numel() // self.bytes_per_block
        blocks = cache_tensor[: total_blocks * self.bytes_per_block].view(self.dtype).view(total_blocks, -1)
        self.cache_tensor = blocks
        # Per layer, (blocks, slots, heads, dim) views of its keys and values, indexed by (block, offset)
        self.views: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
        for i, kept in self.layers.items():
            page = blocks[:, self.page_start[i] : self.page_start[i] + self.tokens_per_page * self.token_width[i]]
            page = page.view(total_blocks, self.tokens_per_page, self.token_width[i])
            key_width = len(kept.key_heads) * self.key_dim
            keys = page[..., :key_width].view(total_blocks, self.tokens_per_page, -1, self.key_dim)
            values = page[..., key_width:].view(total_blocks, self.tokens_per_page, -1, self.value_dim)
            self.views[i] = (keys if kept.key_heads else None, values)
        # Two trash sectors lead the tensor (transformers' layout): slot 0 reads zeros, slot 1 marks where the new
        # tokens go among the keys read, and the first slot of the second sector takes writes that are not kept.
        self.read_trash_index, self.sentinel_index = 0, 1
        self.write_trash_index = self.blocks_per_sector * self.tokens_per_page

    # --- which tokens a request keeps ---------------------------------------------------------------------------

    def kept(self, position: int, length: int) -> bool:
        """Whether the token at `position` is kept once the request holds `length` tokens."""
        return self.window is None or position < self.sinks or position >= length - self.window

    def first_read(self, past_length: int) -> tuple[int, int]:
        """The kept past tokens the first new query may read: the sinks (0..n) and the window (start..past)."""
        sinks = min(self.sinks, past_length) if self.window is not None else past_length
        return sinks, past_length if self.window is None else max(sinks, past_length - self.window)

    def get_seqlen_k(self, past_length: int, query_length: int) -> int:
        sinks, start = self.first_read(past_length)
        return sinks + past_length - start + query_length

    def pages_to_write(self, request_id: str, past_length: int, query_length: int) -> list[int]:
        """Pages the new tokens kept will land on, not yet held."""
        table = self.block_table.get(request_id, [])
        end = past_length + query_length
        pages = {p // self.tokens_per_page for p in range(past_length, end) if self.kept(p, end)}
        return sorted(p for p in pages if p >= len(table) or table[p] is None)

    def pages_passed(self, request_id: str, past_length: int) -> list[int]:
        """Held pages whose tokens no query reads any more: wholly before the window of the next query, and not a
        page of the sinks."""
        if self.window is None:
            return []
        table = self.block_table.get(request_id, [])
        first_needed = past_length - self.window
        sink_pages = ceil(self.sinks / self.tokens_per_page)
        return [p for p, block in enumerate(table) if block is not None and p >= sink_pages
                and (p + 1) * self.tokens_per_page <= first_needed]  # fmt: skip

    def needs_new_blocks(self, request_id: str, past_length: int, query_length: int) -> int:
        new = len(self.pages_to_write(request_id, past_length, query_length))
        return max(0, new - len(self.pages_passed(request_id, past_length)))

    def allocate_cache_to_request(self, request_id: str, past_length: int, query_length: int) -> None:
        table = self.block_table.setdefault(request_id, [])
        passed = self.pages_passed(request_id, past_length)
        self.pool.free_blocks(self.index, [table[p] for p in passed])
        for p in passed:
            table[p] = None
        pages = self.pages_to_write(request_id, past_length, query_length)
        table.extend([None] * (pages[-1] + 1 - len(table) if pages else 0))
        for page, block in zip(pages, self.pool.get_free_blocks(self.index, len(pages)), strict=True):
            table[page] = block

    def free_blocks(self, request_id: str, no_cache: bool = False) -> None:
        blocks = [block for block in self.block_table.pop(request_id, []) if block is not None]
        self.pool.free_blocks(self.index, blocks)

    def held_blocks(self, request_id: str) -> int:
        return sum(block is not None for block in self.block_table.get(request_id, []))

    # --- indices ------------------------------------------------------------------------------------------------

    def position_slots(self, request_id: str, start: int, end: int) -> list[int]:
        """The slots of positions start..end-1, a range per page (this runs for every request of every forward)."""
        table, size, out = self.block_table[request_id], self.tokens_per_page, []
        while start < end:
            page, offset = divmod(start, size)
            stop = min(end, (page + 1) * size)
            first = table[page] * size + offset
            out.extend(range(first, first + stop - start))
            start = stop
        return out

    def get_read_indices(self, request_id: str, past_length: int, query_length: int) -> list[int]:
        """The kept past tokens the queries may read, in position order, then a marker per new token (they come
        from the forward itself: a new token outside the window is used now and never written)."""
        sinks, start = self.first_read(past_length)
        kept = self.position_slots(request_id, 0, sinks) + self.position_slots(request_id, start, past_length)
        return kept + [self.sentinel_index] * query_length

    def get_write_indices(self, request_id: str, past_length: int, query_length: int) -> list[int]:
        """The new tokens' slots: the sinks and the last `window` kept, the others to the trash."""
        end = past_length + query_length
        if self.window is None:
            return self.position_slots(request_id, past_length, end)
        recent = max(past_length, end - self.window)  # the first new token the window keeps
        sinks_end = min(max(past_length, self.sinks), recent)  # new tokens before it that are sinks
        sinks = self.position_slots(request_id, past_length, sinks_end)
        return sinks + [self.write_trash_index] * (recent - sinks_end) + self.position_slots(request_id, recent, end)

    def fill_block_table(self, request_id: str, past_length: int, query_length: int, block_table: torch.Tensor):
        raise NotImplementedError("hf_attn's paged groups have no decode fast path (max_blocks_per_request=0)")

    def get_cache_for_block_table(self, layer_idx: int):
        raise NotImplementedError("hf_attn's paged groups have no decode fast path (max_blocks_per_request=0)")

    # --- the forward's reads and writes -------------------------------------------------------------------------

    def slots(self, read_index: torch.Tensor, write_index: torch.Tensor) -> PageSlots:
        """A forward's indices as (block, offset) pairs, for every layer of the group."""
        size = self.tokens_per_page
        new_rows = (read_index == self.sentinel_index).nonzero().squeeze(-1)
        return PageSlots(read_index // size, read_index % size, new_rows, write_index // size, write_index % size)

    def update(self, key_states: torch.Tensor | None, value_states: torch.Tensor, layer_idx: int,
               slots: PageSlots):  # fmt: skip
        """Keys (or None) and values (N, heads, dim) of the new tokens in, the past ones read out before them
        (N', heads, dim), each request's in turn; then the new tokens kept are written."""
        out = []
        for view, new in zip(self.views[layer_idx], (key_states, value_states), strict=True):
            if view is None:
                out.append(None)
                continue
            if slots.read_blocks.numel():
                every = view[slots.read_blocks, slots.read_offsets]
                every[slots.new_rows] = new
            else:
                every = new
            view[slots.write_blocks, slots.write_offsets] = new
            out.append(every)
        return out[0], out[1]


@dataclass(frozen=True)
class PageSlots:
    """One forward's reads and writes in a group, as (block, offset) pairs: the slots read (new tokens at
    `new_rows` among them) and those written."""

    read_blocks: torch.Tensor
    read_offsets: torch.Tensor
    new_rows: torch.Tensor
    write_blocks: torch.Tensor
    write_offsets: torch.Tensor


class HeadKindPagedCache(PagedAttentionCache):
    """transformers' paged cache with `PageGroup`s: each layer's key/value heads in the group their kind needs.

    The memory sizing is transformers' own (`PagedAttentionMemoryHandler`): sectors, the activation peaks, the
    trash sectors. `num_blocks` (`--cb-num-blocks`) counts blocks of the unmodified model's cache (page_size tokens of
    every key/value head), so one budget means the same bytes for both models, and the smaller pages of a hybridized
    model hold more requests in them.
    """

    def __init__(self, plan: CachePlan, config, continuous_batching_config, device, distributed_helper,
                 begin_batch, dtype: torch.dtype = torch.float16, model_supports_logits_to_keep: bool = False,
                 ) -> None:  # fmt: skip
        if distributed_helper.tp_size > 1:
            raise NotImplementedError("hf_attn's paged cache runs on one device (tensor parallelism is not supported)")
        self.config, self.dtype, self.device, self.plan = config, dtype, device, plan
        self.max_blocks_per_request = 0
        groups = [g for g in (EVERY_TOKEN, SINKS_AND_WINDOW) if plan.group_layers(g)]
        page_size = continuous_batching_config.page_size
        self.cache_allocators: dict[str, PageGroup] = {
            g: PageGroup(i, g, plan.group_layers(g), plan, page_size, dtype) for i, g in enumerate(groups)
        }
        self.layer_to_allocator = {}  # a layer reads several groups: see `update`
        self.bytes_per_sector = lcm(*(ca.bytes_per_block for ca in self.cache_allocators.values()), 128)
        self.tokens_per_sector = max(
            (self.bytes_per_sector // ca.bytes_per_block) * ca.tokens_per_page for ca in self.cache_allocators.values()
        )
        original_bytes_per_block = plan.original_bytes_per_token * page_size
        self.max_batch_tokens, self.num_sectors = PagedAttentionMemoryHandler(
            config=config,
            cb_config=continuous_batching_config,
            dtype=dtype,
            bytes_per_sector=self.bytes_per_sector,
            tokens_per_sector=self.tokens_per_sector,
            bytes_per_block=original_bytes_per_block,
            attn_types=groups,
            model_supports_logits_to_keep=model_supports_logits_to_keep,
        ).infer_max_batch_tokens_and_num_sectors()
        non_trash_bytes = self.num_sectors * self.bytes_per_sector
        self.cache_tensor = torch.zeros(non_trash_bytes + 2 * self.bytes_per_sector, dtype=torch.uint8, device=device)
        self.pool = CachePool(self.num_sectors, len(self.cache_allocators))
        for allocator in self.cache_allocators.values():
            allocator.register_cache_tensor(self.bytes_per_sector, non_trash_bytes, self.cache_tensor, self.pool)
        self.allow_block_sharing = self.use_prefix_sharing = False
        self.num_blocks = non_trash_bytes // original_bytes_per_block
        self.read_cache_limit = None if EVERY_TOKEN in groups else plan.sinks + plan.window
        self.max_decode_fast_path_length = 0
        self.max_tokens_read = max(ca.tokens_per_page * ca.num_blocks for ca in self.cache_allocators.values())
        self.begin_batch = begin_batch
        self.batch = None  # what the current forward's layers read alike (`begin_forward`)

    def begin_forward(self, model, kwargs: dict) -> dict:
        """Called by the model's forward before its layers: works out what they read alike (`begin_batch`)."""
        self.batch = self.begin_batch(model, kwargs, self.plan)
        return kwargs

    @property
    def layers(self) -> list[PagedCacheLayer]:
        """Per layer, what hf_attn's own models' attention layers take as their cache layer."""
        return [PagedCacheLayer(self, i) for i in self.plan.layers]

    def held_bytes(self, request_id: str) -> int:
        """The bytes of cache a request holds now, every group together."""
        return sum(ca.held_blocks(request_id) * ca.bytes_per_block for ca in self.cache_allocators.values())

    @torch.compiler.disable
    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *args, **kwargs):
        """A layer's new keys and values (1, heads, N, dim) in; out, for its attention function (as keys and as
        values), what the forward's batch makes of the keys (or None) and values (1, heads kept there, keys read,
        dim) of each group."""
        groups = {}
        keys, values = key_states[0].transpose(0, 1), value_states[0].transpose(0, 1)  # (N, heads, dim)
        for index, (name, allocator) in enumerate(self.cache_allocators.items()):
            kept = allocator.layers.get(layer_idx)
            if kept is None:
                continue
            k = keys[:, list(kept.key_heads)] if kept.key_heads else None
            v = values[:, list(kept.value_heads)]
            k, v = allocator.update(k, v, layer_idx, self.batch.slots(allocator, index))
            groups[name] = (None if k is None else k.transpose(0, 1)[None], v.transpose(0, 1)[None])
        layer = self.batch.layer(groups, self.plan.layers[layer_idx])
        return layer, layer


@dataclass(frozen=True)
class PagedCacheLayer:
    """One layer of a `HeadKindPagedCache`, as hf_attn's own models' attention layers take it: the layer's whole
    attention, by the forward's batch."""

    cache: HeadKindPagedCache
    layer_idx: int

    def layer_attention(self, attention, hidden_states: torch.Tensor, inputs) -> torch.Tensor:
        return self.cache.batch.layer_attention(attention, hidden_states, inputs, self.cache, self.layer_idx)
