"""PEFT's LoRA and TRL's SFTTrainer on every model type, as docs/peft.md shows them, and the two limits it names."""

from pathlib import Path

import pytest
import torch
from conftest import MODEL_TYPES, tiny_config
from datasets import Dataset
from peft import LoraConfig, PeftModel, get_peft_model
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import SFTConfig, SFTTrainer

TARGETS = ["c_attn", "p_attn"]  # docs/peft.md's one line
TOKENIZER = Path(__file__).parents[2] / "shared" / "data" / "gpt2-tokenizer"


def test_peft_has_no_default_targets_for_our_types_as_the_docs_say():
    """If PEFT ever lists our model types, docs/peft.md's advice is no longer needed: this test says so."""
    model = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2"))
    with pytest.raises(ValueError, match="target_modules"):
        get_peft_model(model, LoraConfig(task_type="CAUSAL_LM"))


@pytest.mark.parametrize("model_type", MODEL_TYPES)
def test_lora_trains_saves_reloads_and_merges(model_type, tmp_path):
    base = AutoModelForCausalLM.from_config(tiny_config(model_type)).eval()
    base.save_pretrained(tmp_path / "base")
    input_ids = torch.randint(3, 37, (4, 10))
    with torch.no_grad():
        before = base(input_ids).logits
    lora = get_peft_model(base, LoraConfig(task_type="CAUSAL_LM", target_modules=TARGETS, r=2))
    trained = {name for name, p in lora.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)
    assert any(".c_attn." in name for name in trained)
    assert any(".p_attn." in name for name in trained) == (model_type == "positional_gpt2")
    optimizer = torch.optim.AdamW([p for p in lora.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        lora(input_ids=input_ids, labels=input_ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    lora.eval()
    with torch.no_grad():
        adapted = lora(input_ids=input_ids).logits
    assert not torch.allclose(adapted, before)  # the adapter changed the model
    lora.save_pretrained(tmp_path / "adapter")
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "base"), tmp_path / "adapter")
    merged = reloaded.merge_and_unload().eval()
    assert type(merged) is type(base)
    with torch.no_grad():
        torch.testing.assert_close(merged(input_ids).logits, adapted, atol=1e-5, rtol=1e-5)


def sft_args(tmp_path) -> SFTConfig:
    return SFTConfig(str(tmp_path / "sft"), max_steps=2, per_device_train_batch_size=2, max_length=16, bf16=False,
                     report_to="none", save_strategy="no")  # fmt: skip


def test_sft_trainer_trains_a_model_object_but_not_a_folder_name(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_config(tiny_config("hybrid_gpt2", vocab_size=len(tokenizer), pad_token_id=None))
    texts = Dataset.from_dict({"text": ["The tower is tall.", "The river is long."] * 4})
    weights = model.lm_head.weight.detach().clone()
    SFTTrainer(model=model, args=sft_args(tmp_path), train_dataset=texts, processing_class=tokenizer).train()
    assert not torch.equal(model.lm_head.weight, weights)
    model.save_pretrained(tmp_path / "model")
    with pytest.raises(AttributeError, match="auto_map"):  # TRL's limit, docs/peft.md's workaround above
        SFTTrainer(model=str(tmp_path / "model"), args=sft_args(tmp_path), train_dataset=texts,
                   processing_class=tokenizer)  # fmt: skip
