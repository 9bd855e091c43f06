"""What every experiment family shares, so that its script holds only its own logic.

- `family`: the `Family` a script declares once (arguments, runs, training, card facts, reports) and the command
  that runs it;
- `arguments`: CONFIG.yaml and flags parsed the HF way, every problem refused before anything is built;
- `runs`: an experiment's runs; one run's lifecycle in `run` (folder, resume), `settings`, `callbacks` and
  `finishing` (results, model folder, push);
- `processes`: which process writes, and one script per output folder;
- `trainers`: in-memory datasets, Paper A's plateau Trainer and test measurements along training;
- `metrics`: token accuracy, perplexity's sliding-window scoring and the input-blind baselines behind collapse
  detection (the metrics themselves are `evaluate` modules, `hf_attn.metrics`);
- `reports`: tables and plots over seeds.
"""

from .arguments import (
    TEST_SEED,
    ModelArguments,
    RunArguments,
    below,
    cli,
    config_problems,
    list_field,
    parse_config,
    pretrained_problems,
)
from .family import Family, Group, family_named, register
from .metrics import (
    argmax_accuracy,
    collapse_check,
    input_blind_error_rate,
    input_blind_mse,
    is_collapsed,
    labelled_argmax,
    perplexity,
    plateau_exit_step,
    unigram_nll,
)
from .processes import is_main_process, say
from .reports import (
    aggregate,
    collapse_summary,
    format_value,
    grid_table,
    markdown_table,
    plot_bars,
    plot_heatmap,
    plot_loss_curves,
    summarize,
    summarize_along_training,
    write_markdown,
    write_report,
    write_task_reports,
)
from .runs import Run, Trained, run_arguments
from .trainers import InMemoryDataset, MeasureAlongTheWay, PlateauTrainer, measured_along_the_way, plateau_trainer

__all__ = [
    "Family",
    "Group",
    "register",
    "family_named",
    "RunArguments",
    "ModelArguments",
    "TEST_SEED",
    "below",
    "list_field",
    "cli",
    "config_problems",
    "parse_config",
    "pretrained_problems",
    "Run",
    "Trained",
    "run_arguments",
    "is_main_process",
    "say",
    "InMemoryDataset",
    "PlateauTrainer",
    "plateau_trainer",
    "MeasureAlongTheWay",
    "measured_along_the_way",
    "argmax_accuracy",
    "collapse_check",
    "input_blind_error_rate",
    "input_blind_mse",
    "is_collapsed",
    "labelled_argmax",
    "perplexity",
    "plateau_exit_step",
    "unigram_nll",
    "aggregate",
    "collapse_summary",
    "format_value",
    "grid_table",
    "markdown_table",
    "plot_bars",
    "plot_heatmap",
    "plot_loss_curves",
    "summarize",
    "summarize_along_training",
    "write_markdown",
    "write_report",
    "write_task_reports",
]
