"""What makes a run's model folder ready for the Hub, checked against its results.json, not against the card code."""

import json
import math
from pathlib import Path

from huggingface_hub import ModelCard
from transformers import AutoTokenizer

import hf_attn

# The model files, which `save_pretrained` must export for remote code: every `*_hf_attn.py` module of the package.
HF_ATTN_CODE = {path.name for path in Path(hf_attn.__file__).parent.glob("*_hf_attn.py")}
AUTO_MAP_KEYS = {"AutoConfig", "AutoModel", "AutoModelForCausalLM", "AutoModelForSequenceClassification",
                 "AutoModelForTokenClassification"}  # fmt: skip


def check_hub_folder(folder: Path, metrics: set[str], tokenizer: bool) -> ModelCard:
    """Weights as safetensors, `use_cache` on, hf_attn's code with every Auto class mapped, the tokenizer where one is
    used, and a card whose `model-index` holds exactly the finite `metrics` of results.json's `by_scale`."""
    files = {path.name for path in folder.iterdir()}
    assert "model.safetensors" in files and "pytorch_model.bin" not in files, files
    config = json.loads((folder / "config.json").read_text())
    assert config["use_cache"] is True
    if config["model_type"] in ("positional_gpt2", "local_gpt2", "hybrid_gpt2"):
        assert HF_ATTN_CODE <= files, files
        assert set(config["auto_map"]) == AUTO_MAP_KEYS
    assert ("tokenizer.json" in files or "vocab.json" in files) == tokenizer, files
    if tokenizer:
        assert len(AutoTokenizer.from_pretrained(folder)) <= config["vocab_size"]

    results = json.loads((folder.parent / "results.json").read_text())
    card = ModelCard.load(folder / "README.md")
    expected = sorted(
        (key, metric, value)
        for key, by_metric in results["by_scale"].items()
        for metric, value in by_metric.items()
        if metric in metrics and math.isfinite(value)
    )
    # Each entry's metric name says which evaluation set it is, e.g. "mse (c=3)", "accuracy (length=41)".
    measured = sorted(
        (entry.metric_name.rsplit("=", 1)[1].rstrip(")"), entry.metric_type, entry.metric_value)
        for entry in card.data.eval_results
    )
    assert measured == expected and expected
    assert results["model"] in card.data.model_name
    assert ("This run collapsed" in card.text) == results.get("collapse", {}).get("collapsed", False)
    assert f"{results['parameters']:,} parameters" in card.text
    return card
