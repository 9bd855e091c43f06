"""Paper B, WikiText-2 perplexity: global-only, local-only and hybrid attention under three position encodings.

Every variant has the same shape and, for a given position encoding, the same parameter count; only which heads
are global or k-local changes. Paper B: hybrid with k = 1 has the lowest perplexity under every encoding.
Perplexity is exp(mean token NLL) over the whole evaluation split, read in sliding windows of `block_size`
tokens that advance by `eval_stride` (every token but the first is scored once, with at least
block_size - eval_stride tokens of context); see `hf_attn.experiments.perplexity`.

    python -m training.wikitext configs/wikitext/cpu.yaml                    # offline: reduced protocol
    python -m training.wikitext configs/wikitext/paper.yaml                  # online: Hub data and tokenizer

Writes OUTPUT_DIR/POSITIONS/VARIANT/seed-S/{results.json, model/} per run and OUTPUT_DIR/{results.md,
perplexity.png, loss.png} over every run in OUTPUT_DIR. Offline without the train split, every output says REDUCED
PROTOCOL (trained on validation, evaluated on test). A run whose test perplexity is within 5% of the unigram model's
(which ignores the context) is flagged as collapsed and left out of the means.
"""

import functools
import itertools
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, Trainer, TrainingArguments, set_seed

import hf_attn  # noqa: F401  (registers the model types)
from hf_attn import experiments
from hf_attn.data.wikitext import language_modelling_blocks, load_wikitext, tokenize_text
from hf_attn.experiments import (
    collapse_check,
    collapse_summary,
    grid_table,
    is_collapsed,
    list_field,
    perplexity,
    plateau_exit_step,
    plot_bars,
    plot_loss_curves,
    summarize,
    unigram_nll,
    write_markdown,
)
from hf_attn.hub import CardFacts
from hf_attn.hybrid import HYBRID_TYPES, last_heads_local
from training import register_family
from training.models import PAPER_B_VARIANTS, VARIANTS_HELP, PaperBModelArguments, parse_variant

POSITION_EMBEDDINGS = ("learned", "rope", "sinusoidal")
ARCHITECTURES = ("gpt2", "llama")


@dataclass
class ExperimentArguments(experiments.RunArguments):
    variants: list[str] = list_field(PAPER_B_VARIANTS, VARIANTS_HELP)
    position_embeddings: list[str] = list_field(
        POSITION_EMBEDDINGS, "Residual-stream position encodings to compare.", POSITION_EMBEDDINGS
    )
    data_dir: str | None = field(
        default=None,
        metadata={"help": "Folder of wiki.{train,valid,test}.raw; unset: the Hub's wikitext-2-raw-v1 (online)."},
    )
    tokenizer: str = field(default="gpt2", metadata={"help": "GPT-2 tokenizer: Hub id or local folder."})
    block_size: int = field(default=1024, metadata={"help": "Training and evaluation context length in tokens."})
    eval_stride: int | None = field(
        default=None, metadata={"help": "Tokens scored per evaluation window; default block_size / 2."}
    )
    max_train_tokens: int | None = field(default=None, metadata={"help": "Use only the first N training tokens."})
    max_eval_tokens: int | None = field(default=None, metadata={"help": "Evaluate on only the first N tokens."})

    run_fields: ClassVar[tuple[str, ...]] = ("variants", "position_embeddings", *experiments.RunArguments.run_fields)
    evaluation_fields: ClassVar[tuple[str, ...]] = ("eval_stride", "max_eval_tokens")


@dataclass
class ModelArguments(PaperBModelArguments):
    architecture: str = field(
        default="gpt2",
        metadata={"help": "`gpt2`: hf_attn's GPT-2-shaped variants (Paper B's). `llama`: a Llama decoder (RMSNorm, "
                  "SwiGLU, Llama's own rotary positions, grouped-query attention, tied embeddings) with the variant's "
                  "heads made local by hf_attn.hybridize; its global heads keep Llama's inclusive mask, "
                  "`attend_to_self` applies to its local heads, and `block_style` is not used.",
                  "choices": ARCHITECTURES},
    )  # fmt: skip
    n_layer: int = field(default=12, metadata={"help": "Depth (GPT-2 small: 12)."})
    n_embd: int = field(default=768, metadata={"help": "Width (GPT-2 small: 768)."})
    n_head: int = field(default=12, metadata={"help": "Heads per layer (GPT-2 small: 12)."})
    n_kv_head: int | None = field(
        default=None, metadata={"help": "Llama only: key/value heads (grouped-query attention); default n_head."}
    )
    intermediate_size: int | None = field(
        default=None,
        metadata={"help": "Llama only: SwiGLU width; default 8/3 n_embd, the parameters of GPT-2's 4 n_embd MLP."},
    )
    vocab_size: int | None = field(default=None, metadata={"help": "Embedding rows; default the tokenizer's size."})


def plan(experiment: ExperimentArguments) -> list[experiments.Group]:
    """A folder of runs per position encoding: OUTPUT_DIR/POSITIONS/VARIANT/seed-S."""
    return [
        experiments.Group(positions, experiment.variants, {"positions": positions})
        for positions in experiment.position_embeddings
    ]


def problems(experiment: ExperimentArguments, model: ModelArguments, training: TrainingArguments) -> list[str]:
    """Every problem at once, before data or the tokenizer are loaded."""
    problems = []
    if experiment.block_size < 2:
        problems.append(f"block_size must be >= 2, got {experiment.block_size}")
    stride = experiment.eval_stride
    if stride is not None and not 1 <= stride < experiment.block_size:
        problems.append(f"eval_stride must be in [1, block_size={experiment.block_size}), got {stride}")
    for name, what in (("max_train_tokens", "one training block"), ("max_eval_tokens", "one evaluation window")):
        tokens = getattr(experiment, name)
        if tokens is not None and tokens < experiment.block_size:
            problems.append(f"{name} must be >= block_size={experiment.block_size} ({what}), got {tokens}")
    if experiment.data_dir is not None and not Path(experiment.data_dir).is_dir():
        problems.append(
            f"data_dir {experiment.data_dir} is not a folder; offline use ../shared/data/wikitext-2-raw, "
            "online leave data_dir unset to download from the Hub"
        )
    if model.architecture == "llama" and experiment.position_embeddings != ["rope"]:
        problems.append(f"architecture llama has Llama's own rotary positions: position_embeddings must be [rope], got "
                        f"{experiment.position_embeddings}")  # fmt: skip
    problems += experiments.pretrained_problems("tokenizer", experiment.tokenizer)
    vocab_size = 1 if model.vocab_size is None else model.vocab_size  # None: the tokenizer's size, once loaded
    return problems + experiments.config_problems({
        f"{variant} with {positions} positions": functools.partial(
            model_config, variant, positions, model, vocab_size, experiment.block_size)
        for variant, positions in itertools.product(experiment.variants, experiment.position_embeddings)
    })  # fmt: skip


def model_config(variant: str, positions: str, model: ModelArguments, vocab_size: int, block_size: int):
    if model.architecture == "llama":
        return llama_config(variant, model, vocab_size, block_size)
    return AutoConfig.for_model(
        **parse_variant(variant),
        n_layer=model.n_layer, n_embd=model.n_embd, n_head=model.n_head, n_positions=block_size,
        block_style=model.block_style, attend_to_self=model.attend_to_self, position_embedding_type=positions,
        scale_embedding=model.scale_embedding,
        vocab_size=vocab_size, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


def llama_config(variant: str, model: ModelArguments, vocab_size: int, block_size: int):
    """A Llama decoder as wide and deep as the GPT-2 variants, its heads laid out as the variant says (`hybrid-K`:
    the first half global, the rest K-local, as hf_attn's `hybrid_gpt2`)."""
    fields = parse_variant(variant)
    heads, layers = model.n_head, model.n_layer
    local_heads = {"global": 0, "hybrid_gpt2": heads // 2, "local_gpt2": heads}[
        "global" if variant == "global" else fields["model_type"]
    ]
    intermediate_size = model.intermediate_size or 8 * model.n_embd // 3
    return HYBRID_TYPES["llama"][0](
        vocab_size=vocab_size, hidden_size=model.n_embd, num_hidden_layers=layers, num_attention_heads=heads,
        num_key_value_heads=model.n_kv_head or heads, intermediate_size=intermediate_size,
        max_position_embeddings=block_size, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
        head_layout=last_heads_local(local_heads, layers, heads), local_window=fields.get("local_window", 1),
        attend_to_self=model.attend_to_self,
    )  # fmt: skip


def build_model(variant: str, positions: str, model: ModelArguments, vocab_size: int, block_size: int):
    return AutoModelForCausalLM.from_config(model_config(variant, positions, model, vocab_size, block_size))


def train_and_evaluate(
    run: experiments.Run, experiment, model_args, training_args, positions: str, data: dict
) -> experiments.Trained:
    set_seed(run.seed)
    model = build_model(run.model, positions, model_args, data["vocab_size"], experiment.block_size)
    trainer = Trainer(model=model, args=experiments.run_arguments(training_args, run), train_dataset=data["train"])
    totals = run.train(trainer, experiment.resume)
    stride = experiment.eval_stride or experiment.block_size // 2
    scores = perplexity(
        model, data["eval_ids"], experiment.block_size, stride, training_args.per_device_eval_batch_size
    )
    unigram = data["unigram"]
    return experiments.Trained(
        trainer, totals, {run.model: scores},
        {
            "protocol": data["description"], "context_length": experiment.block_size, "eval_stride": stride,
            "unigram": unigram,
            "collapse": collapse_check(scores["perplexity"], unigram["test_perplexity"], "perplexity"),
            "left_unigram_plateau_at": plateau_exit_step(totals["loss_curve"] or [], unigram["train_loss"]),
        },
        tokenizer=data["tokenizer"],
    )  # fmt: skip


def card(experiment: ExperimentArguments, results: dict) -> CardFacts:
    return CardFacts(
        paper="B",
        title=f"WikiText-2, {results['positions']} positions",
        training=f"causal language modelling on WikiText-2 ({results['protocol']}), context "
        f"{results['context_length']} tokens",
        inputs="GPT-2's tokenizer, saved beside the weights",
        task_type="text-generation",
        dataset_name="WikiText-2 (raw)",
        key_name="variant",
        metrics=("perplexity",),
        dataset_type="Salesforce/wikitext",
        dataset_config="wikitext-2-raw-v1",
        datasets=("Salesforce/wikitext",),
    )


def load_data(experiment: ExperimentArguments, model: ModelArguments) -> dict:
    """Once, before any run trains: the tokenized splits (as every run's `data`) and the unigram baseline."""
    splits = load_wikitext(experiment.data_dir)
    tokenizer = AutoTokenizer.from_pretrained(experiment.tokenizer)
    vocab_size = model.vocab_size or len(tokenizer)
    if vocab_size < len(tokenizer):
        raise ValueError(
            f"vocab_size={vocab_size} is smaller than the tokenizer's {len(tokenizer)} tokens "
            f"({experiment.tokenizer}): the tokenizer does not match the model's vocabulary."
        )
    train_ids = tokenize_text(splits.train_text, tokenizer)[: experiment.max_train_tokens]
    eval_ids = tokenize_text(splits.eval_text, tokenizer)[: experiment.max_eval_tokens]
    for ids, source in ((train_ids, splits.train_source), (eval_ids, splits.eval_source)):
        if len(ids) < experiment.block_size:
            raise ValueError(f"{source} has {len(ids)} tokens, fewer than block_size={experiment.block_size}")
    train = experiments.InMemoryDataset(language_modelling_blocks(train_ids, experiment.block_size))
    # The model that ignores context: a run within 5% of its test perplexity learned nothing from the context and
    # is left out of the means (`collapse`); its training loss is the plateau a stuck run sits on.
    unigram = {
        "test_perplexity": math.exp(unigram_nll(train_ids, eval_ids[1:], vocab_size)),
        "train_loss": unigram_nll(train_ids, train_ids, vocab_size),
    }
    experiments.say(splits.description)
    data = {"train": train, "eval_ids": eval_ids, "vocab_size": vocab_size, "tokenizer": tokenizer,
            "description": splits.description, "unigram": unigram}  # fmt: skip
    return {"data": data}


def perplexity_text(perplexity: float) -> str:
    """Perplexities to the unit: runs of one cell differ by tens to hundreds."""
    return f"{perplexity:.0f}"


def kept_perplexities(results: list[dict]) -> dict[tuple[str, str], tuple[list[float], int]]:
    """Per (variant, position encoding): the test perplexities of the runs kept (not collapsed), and how many ran."""
    cells: dict[tuple[str, str], tuple[list[float], int]] = {}
    for r in results:
        values, runs = cells.get((r["model"], r["positions"]), ([], 0))
        kept = [] if is_collapsed(r) else [r["by_scale"][r["model"]]["perplexity"]]
        cells[r["model"], r["positions"]] = (values + kept, runs + 1)
    return cells


def perplexity_table(results: list[dict], variants: list[str], encodings: list[str]) -> str:
    """Test perplexity per variant (rows) and position encoding (columns): the mean over the runs kept, the lowest
    and highest run, and how many runs (collapsed ones named below the table and left out of the mean)."""
    grouped, cells = kept_perplexities(results), {}
    for variant in variants:
        for positions in encodings:
            if (variant, positions) in grouped:
                values, runs = grouped[variant, positions]
                spread = f" ({perplexity_text(min(values))}-{perplexity_text(max(values))})" if len(values) > 1 else ""
                mean = perplexity_text(summarize(values)["mean"]) if values else "collapsed"
                cells.setdefault(variant, {})[positions] = f"{mean}{spread}, {len(values)} of {runs} runs"
    return grid_table(cells, "variant")


def encodings_in(results: list[dict], experiment: ExperimentArguments) -> list[str]:
    """The position encodings some run used, in the experiment's order."""
    return [p for p in experiment.position_embeddings if any(r["positions"] == p for r in results)]


def plateau_exit(results: list[dict], variant: str, positions: str) -> str:
    """When the runs of one cell left the unigram plateau: the median step, and whether some never did."""
    exits = [r["left_unigram_plateau_at"] for r in results if (r["model"], r["positions"]) == (variant, positions)]
    left = [step for step in exits if step is not None]
    if not left:
        return "never left the plateau"
    return f"left it at step {statistics.median(left):g}" + ("" if len(left) == len(exits) else ", not every run")


def ranking(results: list[dict], experiment: ExperimentArguments) -> str:
    """Per encoding, the variants from the lowest mean perplexity to the highest, with when they left the unigram
    plateau: which variant learns fastest, and which was slow to start."""
    grouped, lines = kept_perplexities(results), []
    for positions in encodings_in(results, experiment):
        kept = [v for v in experiment.variants if grouped.get((v, positions), ([], 0))[0]]
        means = {v: summarize(grouped[v, positions][0])["mean"] for v in kept}
        ranked = sorted(kept, key=means.get)
        cells = [f"{v} {perplexity_text(means[v])} ({plateau_exit(results, v, positions)})" for v in ranked]
        lines.append(f"- {positions}: " + (" < ".join(cells) or "every run collapsed"))
    heading = "Lowest mean perplexity first, per encoding (and the median step at which runs left the unigram plateau):"
    return heading + "\n\n" + "\n".join(lines)


def perplexity_section(results: list[dict], experiment: ExperimentArguments) -> str:
    """The perplexity table, which runs collapsed (per variant and encoding), and the ranking per encoding, as
    results.md and README show them."""
    by_encoding = [{**r, "model": f"{r['model']} ({r['positions']})"} for r in results]
    table = perplexity_table(results, experiment.variants, encodings_in(results, experiment))
    return "\n\n".join([table, collapse_summary(by_encoding), ranking(results, experiment)])


def loss_text(loss: float | None) -> str:
    """A training loss to three decimals; `n/a` where a run has none (its checkpoint predates the totals)."""
    return "n/a" if loss is None else f"{loss:.3f}"


def runs_table(results: list[dict]) -> str:
    """A row per run: what the means hide (a seed that trained far worse, a run that sat on the unigram plateau)."""
    lines = ["| variant | positions | seed | test perplexity | training loss: mean, last logged | left the unigram "
             "plateau at step | training time |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in sorted(results, key=lambda r: (r["positions"], r["model"], r["seed"])):
        # A run from before the final step was always logged has no loss logged if it had fewer than logging_steps
        steps, last = r["loss_curve"][-1] if r["loss_curve"] else ("n/a", None)
        left, perplexity = r["left_unigram_plateau_at"], r["by_scale"][r["model"]]["perplexity"]
        minutes = "n/a" if r["train_seconds"] is None else f"{r['train_seconds'] / 60:.1f} min"
        lines.append(
            f"| {r['model']} | {r['positions']} | {r['seed']} | {perplexity_text(perplexity)}"
            f" | {loss_text(r['train_loss'])}, {loss_text(last)} | {'never' if left is None else left} of "
            f"{steps} | {minutes} |"
        )
    return "\n".join(lines)


def write_reports(output_dir: Path, results: list[dict], experiment: ExperimentArguments) -> str:
    """results.md (the perplexity table and a row per run), perplexity.png (bars) and loss.png (every run's training
    loss, a panel per position encoding, the unigram plateau dashed)."""
    encodings = encodings_in(results, experiment)
    first = results[0]
    unigram = first["unigram"]
    report = write_markdown(output_dir / "results.md", [
        f"# WikiText-2 perplexity ({len(results)} runs)",
        f"{first['protocol']}. Context {first['context_length']} tokens, evaluation stride {first['eval_stride']}. "
        f"A model that ignores the context (unigram frequencies of the training tokens) has test perplexity "
        f"{unigram['test_perplexity']:.0f} and training loss {unigram['train_loss']:.3f}.",
        "## test perplexity by variant and position encoding: mean over runs (lowest-highest run)",
        perplexity_section(results, experiment),
        "## every run",
        runs_table(results),
    ])  # fmt: skip
    grouped = kept_perplexities(results)
    bars = {p: {v: summarize(grouped[v, p][0]) for v in experiment.variants if grouped.get((v, p), ([], 0))[0]}
            for p in encodings}  # fmt: skip
    plot_bars(bars, output_dir / "perplexity.png", "WikiText-2 test perplexity, mean over runs", "perplexity")
    panels = {p: {} for p in encodings}
    for r in sorted(results, key=lambda r: experiment.variants.index(r["model"])):
        panels[r["positions"]].setdefault(r["model"], []).append(r["loss_curve"])
    plot_loss_curves(panels, output_dir / "loss.png", "WikiText-2 training loss, a line per run",
                     plateau=unigram["train_loss"])  # fmt: skip
    return report


FAMILY = register_family(
    "wikitext", ExperimentArguments, ModelArguments, plan, problems, train_and_evaluate, card, write_reports, load_data
)

if __name__ == "__main__":
    FAMILY.cli()
