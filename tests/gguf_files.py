"""Tiny GGUF files for the tests, written with the `gguf` package the way llama.cpp converts a Llama: no weights from
anywhere, and the model they were written from is the reference for what transformers reads back."""

from pathlib import Path

import gguf
import numpy as np
from transformers import LlamaForCausalLM

TOP_LEVEL = {"model.embed_tokens.weight": "token_embd", "model.norm.weight": "output_norm", "lm_head.weight": "output"}
PER_LAYER = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def llama_cpp_order(weight: np.ndarray, heads: int) -> np.ndarray:
    """Query and key rows as llama.cpp stores them: each head's rotary halves interleaved (transformers undoes it)."""
    return (
        weight.reshape(heads, 2, weight.shape[0] // heads // 2, *weight.shape[1:]).swapaxes(1, 2).reshape(weight.shape)
    )


def write_llama_gguf(model: LlamaForCausalLM, path: Path) -> Path:
    """`model`'s config and float32 weights as a GGUF file (untied embeddings, no tokenizer)."""
    config = model.config
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_name("tiny llama")
    writer.add_block_count(config.num_hidden_layers)
    writer.add_context_length(config.max_position_embeddings)
    writer.add_embedding_length(config.hidden_size)
    writer.add_feed_forward_length(config.intermediate_size)
    writer.add_head_count(config.num_attention_heads)
    writer.add_head_count_kv(config.num_key_value_heads)
    writer.add_layer_norm_rms_eps(config.rms_norm_eps)
    writer.add_rope_freq_base(config.rope_parameters["rope_theta"])
    writer.add_vocab_size(config.vocab_size)
    for name, tensor in model.state_dict().items():
        weight = tensor.detach().float().numpy()
        if name in TOP_LEVEL:
            writer.add_tensor(f"{TOP_LEVEL[name]}.weight", weight)
            continue
        _, _, layer, *module, _ = name.split(".")  # model.layers.N.<module>.weight
        module = ".".join(module)
        if module == "self_attn.q_proj":
            weight = llama_cpp_order(weight, config.num_attention_heads)
        elif module == "self_attn.k_proj":
            weight = llama_cpp_order(weight, config.num_key_value_heads)
        writer.add_tensor(f"blk.{layer}.{PER_LAYER[module]}.weight", weight)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
