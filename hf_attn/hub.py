"""Hub-ready run folders: a model card from `model_cards/`, filled from a run's results, and the upload of the folder.

An experiment run saves its model to `RUN/model` (weights as safetensors, config with `use_cache=True`, the modeling
code with a full `auto_map`, the tokenizer where one is used) and writes `README.md` there: the model card, with the
run's measured results as `model-index` eval results. `push_run` uploads that folder to one Hub repository.
"""

import math
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import yaml
from huggingface_hub import EvalResult, HfApi, ModelCard, ModelCardData, constants, get_token
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .configuration_hf_attn import HfAttnConfig
from .modeling_hf_attn import AUTO_CLASS_SUFFIXES

CARD_TEMPLATE = files("hf_attn") / "model_cards" / "experiment_run.md"
CARD_FILE = "README.md"
PIPELINE_TAGS = {
    "AutoModelForCausalLM": "text-generation",
    "AutoModelForTokenClassification": "token-classification",
    "AutoModelForSequenceClassification": "text-classification",
}


@dataclass(frozen=True)
class Paper:
    key: str
    title: str
    authors: str  # BibTeX form: "Last, First and Last, First"
    booktitle: str
    venue: str
    year: int
    arxiv: str

    @property
    def bibtex(self) -> str:
        fields = {"title": self.title, "author": self.authors, "booktitle": self.booktitle, "year": self.year,
                  "note": f"arXiv:{self.arxiv}"}  # fmt: skip
        return "\n".join([f"@inproceedings{{{self.key},", *(f"  {k:<9} = {{{v}}}," for k, v in fields.items()), "}"])


PAPERS = {
    "A": Paper(
        "deluca2025positional",
        "Positional Attention: Expressivity and Learnability of Algorithmic Computation",
        "Back de Luca, Artur and Giapitzakis, George and Yang, Shenghao and Veli{\\v{c}}kovi{\\'c}, Petar and "
        "Fountoulakis, Kimon",
        "International Conference on Machine Learning (ICML)",
        "ICML 2025",
        2025,
        "2410.01686",
    ),
    "B": Paper(
        "li2026local",
        "Characterizing the Expressivity of Local Attention in Transformers",
        "Li, Jiaoda and Cotterell, Ryan",
        "Annual Meeting of the Association for Computational Linguistics (ACL)",
        "ACL 2026",
        2026,
        "2605.00768",
    ),
}


@dataclass(frozen=True)
class ExperimentFacts:
    """What a model card says about one experiment family. `title`, `training` and `dataset_name` are
    `str.format`ted with the run's results and its experiment config; each `by_scale` key of the results is one
    evaluation set, named `"{key_name}={key}"`, and each of `metrics` measured on it is one `model-index` entry."""

    paper: str
    title: str
    training: str
    inputs: str
    task_type: str
    dataset_name: str
    key_name: str
    metrics: tuple[str, ...]
    dataset_type: str = "synthetic"
    dataset_config: str | None = None
    datasets: tuple[str, ...] = ()


EXPERIMENTS = {
    "algorithmic": ExperimentFacts(
        paper="A",
        title="{task}",
        training="per-position regression on Paper A's `{task}` task: {length} numbers per sample from sub-ranges "
        "of [{train_low}, {train_high}] ({train_samples} samples), tested out of distribution on "
        "[c * {train_low}, c * {train_high}] for c in {scales}",
        inputs="`hf_attn.data.algorithmic_dataset` builds them: `numeric_values` alone, the numbers and the "
        "scratchpad 0; the prediction at each position is `logits[..., 0]`",
        task_type="token-classification",
        dataset_name="{task} (synthetic numbers)",
        key_name="c",
        metrics=("mse", "accuracy"),
    ),
    "mixed": ExperimentFacts(
        paper="A",
        title="mixed {task}",
        training="Paper A's mixed text-and-numbers task `{task}`: 8 priced categories and 2 decoys, prices from "
        "[0, 5] ({train_samples} samples), tested on [0, 5c] for c in {scales} with the category names seen in "
        "training (`_seen`) and with unseen ones (`_unseen`)",
        inputs="`hf_attn.data.mixed_dataset` builds them; the positional and standard models read character ids with"
        " the prices as `numeric_values` and regress the answer at position 0, GPT-2 reads the text and "
        "writes ` Answer: ...`",
        task_type="token-classification",
        dataset_name="mixed {task} (synthetic)",
        key_name="c",
        metrics=tuple(f"{m}_{names}" for m in ("mse", "mape", "unparsed") for names in ("seen", "unseen")),
    ),
    "induction": ExperimentFacts(
        paper="A",
        title="k-hop induction, depth {depth}",
        training="Paper A's k-hop induction heads: a hop token then {length} characters, k in 0..{max_hops}, "
        "{train_samples} training samples; tested on fresh samples (id) and on unseen characters (ood)",
        inputs="`hf_attn.data.khop_dataset` builds them: a `<hop k>` token, then the characters; the target at each "
        "character is read from the logits there",
        task_type="token-classification",
        dataset_name="k-hop induction (synthetic)",
        key_name="depth",
        metrics=("accuracy_id", "accuracy_ood", "loss_id", "loss_ood"),
    ),
    "formal_languages": ExperimentFacts(
        paper="B",
        title="{language}, {positions} positions",
        training="recognition of Paper B's formal language `{language}` (the decision is read at `<eos>`): "
        "{train_samples} strings of length {train_min_length}..{train_max_length}, tested on lengths "
        "{test_min_length}..{test_max_length}",
        inputs="`hf_attn.data.formal_language_dataset` builds them: `<bos>` (id 1), the symbols (ids 3, 4, ... in "
        "alphabet order), `<eos>` (id 2); label 1 (in the language) or 0 is the argmax of the logits at "
        "`<eos>`",
        task_type="text-classification",
        dataset_name="{language} (synthetic strings)",
        key_name="length",
        metrics=("accuracy",),
    ),
    "wikitext": ExperimentFacts(
        paper="B",
        title="WikiText-2, {positions} positions",
        training="causal language modelling on WikiText-2 ({protocol}), context {context_length} tokens",
        inputs="GPT-2's tokenizer, saved beside the weights",
        task_type="text-generation",
        dataset_name="WikiText-2 (raw)",
        key_name="variant",
        metrics=("perplexity",),
        dataset_type="Salesforce/wikitext",
        dataset_config="wikitext-2-raw-v1",
        datasets=("Salesforce/wikitext",),
    ),
}


# --- the model card ------------------------------------------------------------------------------------------


def auto_class_name(config) -> str:
    """The Auto class that loads `config.architectures[0]`, e.g. `AutoModelForCausalLM` for `...LMHeadModel`."""
    architecture = (config.architectures or ["Model"])[0]
    by_longest_suffix = sorted(AUTO_CLASS_SUFFIXES.items(), key=lambda item: -len(item[1]))
    return next(auto for auto, suffix in by_longest_suffix if architecture.endswith(suffix))


def head_layout_table(config) -> str:
    """One row per run of layers with the same head kinds: which heads are global, local or positional."""
    if not isinstance(config, HfAttnConfig):
        return f"GPT-2: {config.n_layer} layers of {config.n_head} global heads with causal, inclusive masks."
    rows, start = [], 0
    layout = config.head_layout
    for layer in range(1, len(layout) + 1):
        if layer == len(layout) or layout[layer] != layout[start]:
            counts = {kind: layout[start].count(kind) for kind in ("global", "local", "positional")}
            layers = str(start) if layer - 1 == start else f"{start}-{layer - 1}"
            rows.append(f"| {layers} | {counts['global']} | {counts['local']} | {counts['positional']} |")
            start = layer
    masks = "inclusive (a token sees itself)" if config.attend_to_self else "strict (a token never sees itself)"
    return "\n".join([
        "| layers | global heads | local heads | positional heads |", "|---|---|---|---|", *rows, "",
        f"Local window k = {config.local_window}; masks {masks}; {'causal' if config.is_causal else 'bidirectional'}; "
        f"block `{config.block_style}`; positions in the residual stream: `{config.position_embedding_type}`"
        + (f"; positional heads read P = `{config.positional_encoding}`." if config.uses_positional_heads else "."),
    ])  # fmt: skip


def eval_results(results: dict, facts: ExperimentFacts, dataset_name: str) -> list[EvalResult]:
    """Every finite metric of `facts.metrics` measured on every evaluation set of the run."""
    return [
        EvalResult(
            task_type=facts.task_type, dataset_type=facts.dataset_type, dataset_name=dataset_name,
            dataset_config=facts.dataset_config or f"{facts.key_name}={key}", dataset_split="test",
            metric_type=metric, metric_name=f"{metric} ({facts.key_name}={key})", metric_value=float(value),
        )
        for key, metrics in results["by_scale"].items()
        for metric, value in metrics.items()
        if metric in facts.metrics and math.isfinite(value)
    ]  # fmt: skip


def results_table(results: dict, facts: ExperimentFacts) -> str:
    metrics = [m for m in facts.metrics if any(m in row for row in results["by_scale"].values())]
    lines = [f"| {facts.key_name} | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for key, row in results["by_scale"].items():
        lines.append(f"| {key} | " + " | ".join(f"{row[m]:.4g}" if m in row else "n/a" for m in metrics) + " |")
    return "\n".join(lines)


def model_card(results: dict, config, repo_id: str | None = None) -> ModelCard:
    """The card of one run's model, from `model_cards/experiment_run.md`; `repo_id` goes into the usage example."""
    facts = EXPERIMENTS[results["experiment"]]
    paper = PAPERS[facts.paper]
    fields = {**results.get("config", {}).get("experiment", {}), **results}
    name = f"{results['model']} ({config.model_type}): {facts.title.format(**fields)}, seed {results['seed']}"
    auto_class = auto_class_name(config)
    card_data = ModelCardData(
        model_name=name, library_name="transformers", license="apache-2.0", pipeline_tag=PIPELINE_TAGS.get(auto_class),
        tags=["hf_attn", config.model_type, results["experiment"], f"arxiv:{paper.arxiv}"],
        datasets=list(facts.datasets) or None,
        eval_results=eval_results(results, facts, facts.dataset_name.format(**fields)),
    )  # fmt: skip
    run = {key: value for key, value in results.items() if key not in ("by_scale", "config")}
    return ModelCard.from_template(
        card_data,
        template_path=str(CARD_TEMPLATE),
        name=name,
        config=config,
        parameters=results["parameters"],
        paper=paper,
        training_data=facts.training.format(**fields),
        inputs=facts.inputs,
        head_layout=head_layout_table(config),
        results_table=results_table(results, facts),
        collapse=results.get("collapse"),
        training_yaml=yaml.safe_dump({"run": run, **results.get("config", {})}, sort_keys=False).strip(),
        auto_class=auto_class,
        repo_id=repo_id or "path/to/this/folder",
        needs_hf_attn=isinstance(config, HfAttnConfig),
    )


def write_model_card(folder: Path, results: dict, config, repo_id: str | None = None) -> Path:
    path = Path(folder) / CARD_FILE
    model_card(results, config, repo_id).save(path)
    return path


# --- pushing -------------------------------------------------------------------------------------------------


def hub_problems(push_to_hub: bool, hub_token: str | None) -> list[str]:
    """Why a push could not work, found before any training: offline mode or no token."""
    if not push_to_hub:
        return []
    if constants.HF_HUB_OFFLINE:
        return ["push_to_hub needs the Hub, but HF_HUB_OFFLINE is set: unset it, or push the saved folders later"]
    if not (hub_token or get_token()):
        return ["push_to_hub needs a Hub token: run `hf auth login`, set HF_TOKEN, or pass --hub_token"]
    return []


def run_repo_id(base: str, run_path: Path) -> str:
    """`base-<run path joined by dashes>`: one repository per run, e.g. `me/attn-cumulative_min-positional-seed-0`."""
    repo_id = "-".join([base, *run_path.parts])
    try:
        validate_repo_id(repo_id)
    except HFValidationError as error:
        raise ValueError(
            f"hub_model_id {base!r} gives the invalid repo id {repo_id!r} for run {run_path}: {error}"
        ) from None
    return repo_id


def push_run(
    folder: Path, results: dict, config, repo_id: str, token: str | None = None, private: bool | None = None
) -> str:
    """Renders the card for `repo_id`, creates the repository if needed and uploads `folder`; returns its URL."""
    api = HfApi(token=token)
    write_model_card(folder, results, config, repo_id)
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=url.repo_id, folder_path=folder, commit_message=f"hf_attn: {results['model']} run")
    return str(url)
