"""Model cards from the templates in `model_cards/`, and uploads to the Hub.

Two kinds of card, both describing only the head kinds and masks the model has:
- a run's card (`model_cards/experiment_run.md`): an experiment run saves its model to `RUN/model` (weights as
  safetensors, config with `use_cache=True`, the modeling code with a full `auto_map`, the tokenizer where one is used)
  and writes `README.md` there, with the run's measured results as `model-index` eval results. `push_run` uploads
  that folder to one Hub repository.
- a model type's card (`model_cards/<model_type>.md`) for any other checkpoint, made by hand or by `convert_gpt2`:
  `save_pretrained` writes it and `push_to_hub` uploads it (`CardSharing.sharing` is this module). Models given
  per-head kinds by `hf_attn.hybridize` get `model_cards/hybrid_decoder.md`, which names their base (`BaseModel`)
  and, where `hf_attn.select_heads` chose the layout, what choosing it cost.
"""

import itertools
import math
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import jinja2
import torch
import yaml
from huggingface_hub import (
    EvalResult,
    HfApi,
    ModelCard,
    ModelCardData,
    constants,
    get_token,
)
from huggingface_hub.utils import HFValidationError, validate_repo_id

from .configuration_hf_attn import HfAttnConfig
from .head_kinds_hf_attn import HeadKind, kinds_in, visible_keys
from .hybrid import HYBRID_TYPES, HybridConfigMixin, cache_bytes_per_token, original_cache_bytes_per_token
from .modeling_hf_attn import AUTO_CLASS_SUFFIXES
from .provenance import CARD_FILE, BaseModel
from .visibility_hf_attn import Visibility

# `model_cards/` sits at the top of the repository; the wheel ships it inside the package (pyproject.toml maps it to
# `hf_attn/model_cards`), so an installed hf_attn finds it there and a source checkout beside the package.
CARD_FOLDERS = [Path(__file__).resolve().parent / "model_cards", Path(__file__).resolve().parents[1] / "model_cards"]
CARD_TEMPLATES = jinja2.Environment(loader=jinja2.FileSystemLoader(CARD_FOLDERS))
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
    def reference(self) -> str:
        """Title, venue and arXiv link, in Markdown."""
        return f"*{self.title}* ({self.venue}, [arXiv {self.arxiv}](https://arxiv.org/abs/{self.arxiv}))"

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
class CardFacts:
    """What a run's model card says about its experiment, from the run's results (`Family.card` makes it): the
    `title` and `training` prose, the model's `inputs`, and how its results go into `model-index` (each `by_scale`
    key of the results is one evaluation set, named `"{key_name}={key}"`, and each of `metrics` measured on it one
    entry)."""

    paper: str  # a key of PAPERS
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

    def __post_init__(self):
        if self.paper not in PAPERS:
            raise ValueError(f"`paper` must be one of {list(PAPERS)}, got {self.paper!r}.")


# --- what every card says: the head layout ---------------------------------------------------------------------


def auto_class_name(config) -> str:
    """The Auto class that loads `config.architectures[0]`, e.g. `AutoModelForCausalLM` for `...LMHeadModel`, or for
    a hybridized model's `HfAttnLlamaForCausalLM`."""
    architecture = (config.architectures or ["Model"])[0]
    if isinstance(config, HybridConfigMixin):
        model_classes = HYBRID_TYPES[config.model_type.removeprefix("hf_attn_")][1]
        return next(auto for auto, cls in model_classes.items() if cls.__name__ == architecture)
    by_longest_suffix = sorted(AUTO_CLASS_SUFFIXES.items(), key=lambda item: -len(item[1]))
    return next(auto for auto, suffix in by_longest_suffix if architecture.endswith(suffix))


def layer_runs(head_layout: list[list[str]]) -> list[tuple[str, list[str]]]:
    """Runs of consecutive layers with the same heads: ("0-1", heads of layers 0 and 1), ("2", heads of layer 2)."""
    runs = []
    for layer, run in itertools.groupby(enumerate(head_layout), key=lambda item: item[1]):
        indices = [index for index, _ in run]
        runs.append((str(indices[0]) if len(indices) == 1 else f"{indices[0]}-{indices[-1]}", layer))
    return runs


def head_counts(config: HfAttnConfig) -> list[tuple[str, dict[str, int]]]:
    """Per run of equal layers (see `layer_runs`), how many heads of each kind the model has it holds."""
    kinds = kinds_in(*config.head_layout)
    return [(layers, {kind.name: layer.count(kind.name) for kind in kinds}) for layers, layer in
            layer_runs(config.head_layout)]  # fmt: skip


def kind_settings(kind: HeadKind, config: HfAttnConfig) -> dict:
    """The config fields that shape what heads of `kind` see, e.g. `{"local_window": 2}`; one at 0 switches
    something off (no sinks) and is left out."""
    return {field: getattr(config, field) for field in kind.config_fields if getattr(config, field) != 0}


def mask_grids(kinds: list[HeadKind], config: HfAttnConfig, size: int = 5) -> list[str]:
    """Each kind's mask over the first `size` positions (■ seen, ⬚ not), side by side, from the predicate the kernels
    use."""
    positions = torch.arange(size)
    titles, grids = [], []
    for kind in kinds:
        window = kind.window(config)
        titles.append(kind.name if window is None else f"{kind.name} (k = {window})")
        seen = kind.visibility(config).predicate(positions[:, None], positions[None, :]).tolist()
        grids.append([" ".join("■" if visible else "⬚" for visible in row) for row in seen])
    width = max(len(title) for title in [*titles, grids[0][0]])
    columns = [[title, *grid] for title, grid in zip(titles, grids, strict=True)]
    return ["   ".join(column[row].ljust(width) for column in columns).rstrip() for row in range(size + 1)]


def settings_note(kind: HeadKind, config: HfAttnConfig) -> str:
    fields = ", ".join(f"`{field}` = {value!r}" for field, value in kind_settings(kind, config).items())
    return f" ({fields})" if fields else ""


def head_layout_section(config) -> str:
    """What each kind of head the model has sees, how many of each every layer holds, and the masks drawn."""
    if isinstance(config, HybridConfigMixin):
        return hybrid_layout_section(config)
    if not isinstance(config, HfAttnConfig):
        return f"GPT-2: {config.n_layer} layers of {config.n_head} global heads with causal, inclusive masks."
    kinds = kinds_in(*config.head_layout)
    direction = "Causal" if config.is_causal else "Bidirectional"
    masks = (
        "inclusive masks (a token sees itself)" if config.attend_to_self else "strict masks (a token never sees itself)"
    )
    strict_causal = config.is_causal and not config.attend_to_self
    empty_row = "; position 0 sees nothing, and its attention output is zero" if strict_causal else ""
    return "\n".join([
        f"{direction}, {masks}. Per kind of head:", "",
        *(f"- **{kind.name}** heads{settings_note(kind, config)}: {kind.describe(config)}." for kind in kinds), "",
        "| layers | " + " | ".join(f"{kind.name} heads" for kind in kinds) + " |", "|---" * (len(kinds) + 1) + "|",
        *(f"| {layers} | " + " | ".join(map(str, counts.values())) + " |" for layers, counts in head_counts(config)),
        "",
        f"Who sees whom over the first five positions, rows are queries and columns keys{empty_row}:", "",
        "```text", *mask_grids(kinds, config), "```", "",
        f"Block `{config.block_style}`; positions in the residual stream: `{config.position_embedding_type}`.",
    ])  # fmt: skip


def hybrid_layout_section(config) -> str:
    """Which heads of a hybridized model are local or positional, what they see, and what the cache keeps per token."""
    kinds = ["global", "local"] + (["positional"] if any("positional" in layer for layer in config.head_layout) else [])
    kept_as = {"global": "kept whole", "local": "kept as a window", "positional": "kept as values only"}
    rows = []
    for layers, layer in layer_runs(config.head_layout):
        kept = config.kv_head_layout[int(layers.split("-")[0])]  # the same in every layer of the run
        counts = [layer.count(kind) for kind in kinds] + [kept.count(kind) for kind in kinds]
        rows.append(f"| {layers} | " + " | ".join(map(str, counts)) + " |")
    seen = visible_keys(Visibility(True, config.attend_to_self, config.local_window, config.sink_tokens))
    ours, original = cache_bytes_per_token(config), original_cache_bytes_per_token(config)
    header = [f"{kind} heads" for kind in kinds] + [f"key/value heads {kept_as[kind]}" for kind in kinds]
    positional = (
        [f"Positional heads weigh every earlier token and themselves by the fixed positional encoding P alone "
         f"(`positional_encoding` = {config.positional_encoding}, {config.positional_encoding_dim} wide, through their "
         f"own projection `p_attn`): the same weights for every input; their values come from the data.", ""]
        if "positional" in kinds else []
    )  # fmt: skip
    return "\n".join([
        f"Global heads attend as in the original `{config.model_type.removeprefix('hf_attn_')}` model; local heads see "
        f"only {seen} (`local_window` = {config.local_window}, `sink_tokens` = {config.sink_tokens}).", "",
        *positional,
        "| layers | " + " | ".join(header) + " |", "|---" * (len(header) + 1) + "|", *rows, "",
        "A key/value head is kept whole when a global query head reads it (grouped-query attention), or heads of "
        "several kinds do; only its values when positional heads alone read it; else only its window. At long "
        f"context the cache grows by {ours:,} bytes per token in 16-bit precision, {ours / original:.2f}x the "
        f"original model's {original:,}.",
    ])  # fmt: skip


def loading(config) -> str:
    """How the card says to load the model: `plain` (GPT-2), `remote_code` (the code is saved beside the weights) or
    `hf_attn` (hf_attn must be installed)."""
    if isinstance(config, HybridConfigMixin):
        return "hf_attn"
    if not isinstance(config, HfAttnConfig):
        return "plain"
    return "remote_code" if getattr(config, "auto_map", None) else "hf_attn"


def render_card(template: str, card_data: ModelCardData, **fields) -> ModelCard:
    """`model_cards/<template>` filled in as `ModelCard.from_template` does, through an environment that follows the
    templates' `extends`."""
    text = CARD_TEMPLATES.get_template(template).render(card_data=card_data.to_yaml(), papers=PAPERS, **fields)
    return ModelCard(text)


# --- a run's card ----------------------------------------------------------------------------------------------


def eval_results(results: dict, facts: CardFacts) -> list[EvalResult]:
    """Every finite metric of `facts.metrics` measured on every evaluation set of the run."""
    return [
        EvalResult(
            task_type=facts.task_type, dataset_type=facts.dataset_type, dataset_name=facts.dataset_name,
            dataset_config=facts.dataset_config or f"{facts.key_name}={key}", dataset_split="test",
            metric_type=metric, metric_name=f"{metric} ({facts.key_name}={key})", metric_value=float(value),
        )
        for key, metrics in results["by_scale"].items()
        for metric, value in metrics.items()
        if metric in facts.metrics and math.isfinite(value)
    ]  # fmt: skip


def results_table(results: dict, facts: CardFacts) -> str:
    metrics = [m for m in facts.metrics if any(m in row for row in results["by_scale"].values())]
    lines = [f"| {facts.key_name} | " + " | ".join(metrics) + " |", "|---" * (len(metrics) + 1) + "|"]
    for key, row in results["by_scale"].items():
        lines.append(f"| {key} | " + " | ".join(f"{row[m]:.4g}" if m in row else "n/a" for m in metrics) + " |")
    return "\n".join(lines)


def model_card(results: dict, config, facts: CardFacts, repo_id: str | None = None) -> ModelCard:
    """The card of one run's model, from `model_cards/experiment_run.md`: `facts` say what its experiment is (its
    family's `card`), `repo_id` goes into the usage example."""
    paper = PAPERS[facts.paper]
    name = f"{results['model']} ({config.model_type}): {facts.title}, seed {results['seed']}"
    auto_class = auto_class_name(config)
    card_data = ModelCardData(
        model_name=name, library_name="transformers", license="apache-2.0", pipeline_tag=PIPELINE_TAGS.get(auto_class),
        tags=["hf_attn", config.model_type, results["experiment"], f"arxiv:{paper.arxiv}"],
        datasets=list(facts.datasets) or None,
        eval_results=eval_results(results, facts),
    )  # fmt: skip
    run = {key: value for key, value in results.items() if key not in ("by_scale", "config")}
    return render_card(
        "experiment_run.md",
        card_data,
        name=name,
        config=config,
        parameters=results["parameters"],
        paper=paper,
        training_data=facts.training,
        inputs=facts.inputs,
        head_layout=head_layout_section(config),
        results_table=results_table(results, facts),
        collapse=results.get("collapse"),
        training_yaml=yaml.safe_dump({"run": run, **results.get("config", {})}, sort_keys=False).strip(),
        auto_class=auto_class,
        repo_id=repo_id or "path/to/this/folder",
        loading=loading(config),
    )


def write_model_card(folder: Path, results: dict, config, facts: CardFacts, repo_id: str | None = None) -> Path:
    path = Path(folder) / CARD_FILE
    model_card(results, config, facts, repo_id).save(path)
    return path


# --- a model type's card, for checkpoints made by hand or by convert_gpt2 -------------------------------------------


def selection_section(config) -> str | None:
    """How `hf_attn.select_heads` chose the layout and what the scoring cost, as `select_heads.apply_layout` recorded
    it (`config.head_selection`); None where it did not, or where the layout, window or sinks changed since."""
    selection = getattr(config, "head_selection", None)
    fields = ("head_layout", "local_window", "sink_tokens")
    if not selection or any(selection.get(field) != getattr(config, field) for field in fields):
        return None
    units = {"kv_group": "key/value groups", "head": "query heads"}.get(selection["unit"], selection["unit"])
    cost, calibration = selection["cost"], selection["calibration"]
    return (
        f"`hf_attn.select_heads` ranked the {units} of `{selection['model']}` by its `{selection['score']}` score on "
        f"{calibration['blocks']} calibration blocks of {calibration['block_size']} tokens ({calibration['data']}) "
        f"and made the lowest {selection['local_fraction']:.0%} local. Measured cost of the scoring: "
        f"{cost['seconds']:g} s, forward passes: {cost['forward_passes']:,} over {cost['forward_tokens']:,} tokens, "
        f"{cost['backward_passes']:,} of them followed by a backward pass."
    )


def model_type_card(
    model, repo_id: str | None = None, base_model: str | None = None, conversion: str | None = None, tags=()
) -> ModelCard:
    """The card of a saved model that no experiment run made, from `model_cards/<model_type>.md`.

    `base_model`: the Hub id of the checkpoint its weights come from; `conversion`: a paragraph on how they were
    converted (both from `convert_gpt2`).
    """
    config = model.config
    hybrid = isinstance(config, HybridConfigMixin)
    base = BaseModel.of(config) if hybrid else None
    auto_class = auto_class_name(config)
    base_model = base_model or (base.repo_id if base else None)
    # The Hub's relations: adapter (weights added to the base's), merge (several bases), quantized, finetune. A
    # hybridized model holds every weight of its base, changed in what each head sees (and trained, if the user
    # trains it): the Hub's "finetune", which it would infer anyway; the card's text says what changed.
    relation = {"base_model_relation": "finetune"} if hybrid and base_model else {}
    card_data = ModelCardData(
        model_name=repo_id or config.model_type, library_name="transformers", base_model=base_model,
        license=base.license if base else None, pipeline_tag=PIPELINE_TAGS.get(auto_class),
        tags=list(dict.fromkeys(["hf_attn", config.model_type, *(model.model_tags or []), *tags])), **relation,
    )  # fmt: skip
    return render_card(
        "hybrid_decoder.md" if hybrid else CARD_TEMPLATES.select_template([f"{config.model_type}.md", "model.md"]).name,
        card_data,
        name=repo_id or config.model_type,
        config=config,
        parameters=model.num_parameters(),
        conversion=conversion,
        base=base.paragraph(config) if base else None,
        selection=selection_section(config) if hybrid else None,
        head_layout=head_layout_section(config),
        auto_class=auto_class,
        repo_id=repo_id or "path/to/this/folder",
        loading=loading(config),
    )


def write_model_type_card(model, folder: str | os.PathLike, repo_id: str | None = None, **card_fields) -> Path:
    """Writes `model_type_card` as the folder's README.md (what `save_pretrained` calls)."""
    path = Path(folder) / CARD_FILE
    model_type_card(model, repo_id, **card_fields).save(path)
    return path


# --- pushing -------------------------------------------------------------------------------------------------


def hub_offline() -> bool:
    """Whether the Hub is off by the user's choice, read when asked (tests and notebooks set it late): HF_HUB_OFFLINE
    or TRANSFORMERS_OFFLINE (huggingface_hub, transformers) or HF_DATASETS_OFFLINE (datasets) set to a true value."""
    return any(os.environ.get(name, "").upper() in constants.ENV_VARS_TRUE_VALUES
               for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"))  # fmt: skip


def hub_problems(push_to_hub: bool, hub_token: str | None) -> list[str]:
    """Why a push could not work, found before any training: offline mode or no token."""
    if not push_to_hub:
        return []
    if hub_offline():
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
    folder: Path, results: dict, config, facts: CardFacts, repo_id: str, token: str | None = None,
    private: bool | None = None,
) -> str:  # fmt: skip
    """Renders the card for `repo_id`, creates the repository if needed and uploads `folder`; returns its URL."""
    api = HfApi(token=token)
    write_model_card(folder, results, config, facts, repo_id)
    url = api.create_repo(repo_id, private=private, exist_ok=True)
    api.upload_folder(repo_id=url.repo_id, folder_path=folder, commit_message=f"hf_attn: {results['model']} run")
    return str(url)


def push_model(
    model, repo_id: str, *, commit_message: str | None = None, commit_description: str | None = None,
    private: bool | None = None, token: bool | str | None = None, revision: str | None = None,
    create_pr: bool = False, max_shard_size: int | str | None = "50GB", tags: list[str] | str | None = None,
):  # fmt: skip
    """`model.push_to_hub` where hf_attn is installed: transformers' push and arguments, with the model type's card
    naming the repository in place of transformers' generic card. The card is made anew from the model at every push.
    Returns the upload's `CommitInfo`."""
    api = HfApi(token=token)
    repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
    if revision is not None and not revision.startswith("refs/pr"):
        api.create_branch(repo_id, branch=revision, exist_ok=True)
    with tempfile.TemporaryDirectory() as folder:
        model.save_pretrained(folder, max_shard_size=max_shard_size)
        write_model_type_card(model, folder, repo_id, tags=[tags] if isinstance(tags, str) else tags or ())
        return api.upload_folder(
            repo_id=repo_id, folder_path=folder, commit_message=commit_message or f"Upload {type(model).__name__}",
            commit_description=commit_description, revision=revision, create_pr=create_pr,
        )  # fmt: skip
