"""The benchmarks run end to end at a tiny shape, their figures behave as the head kinds say, the masked-SDPA
baseline computes our attention, and the GPU runner keeps to its plan and budget."""

import ctypes
import itertools
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks import attention_layer, gpu
from benchmarks.common import Shape, build_model, masked_local_attention
from hf_attn.attention_hf_attn import Visibility, local_attention
from hf_attn.layers_hf_attn import HfAttnAttention

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("local-1", "local-4", "hybrid-1", "positional", "gpt2")
CONTEXTS = (16, 32)
TINY = ["--n-layer", "1", "--n-embd", "32", "--n-head", "4", "--vocab-size", "100"]


def run_benchmark(module: str, *args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess:
    """`python -m benchmarks.<module> ...` from the repository root, as the README runs it (or from `cwd`), without
    the $OUT that the GPU device tool sets."""
    env = {key: value for key, value in os.environ.items() if key != "OUT"}
    env |= {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    # The timeout catches a hang, not a busy machine: the GPU runner's tiny run took 4 min beside two busy processes.
    return subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", *args], cwd=cwd, capture_output=True, text=True, env=env,
        timeout=900, check=False,
    )  # fmt: skip


def table_rows(stdout: str, width: int) -> list[list[str]]:
    """The cells of every Markdown table row with `width` cells, headers and rules left out."""
    lines = stdout.splitlines()
    rows = []
    for line, after in zip(lines, [*lines[1:], ""], strict=True):
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if (
            line.startswith("|")
            and len(cells) == width
            and not line.startswith("|---")
            and not after.startswith("|---")
        ):
            rows.append(cells)
    return rows


# --- the masked-SDPA baseline ----------------------------------------------------------------------------------


@pytest.mark.parametrize("local_window", [1, 2, 5])
@pytest.mark.parametrize("is_causal,attend_to_self,padded", list(itertools.product([True, False], repeat=3)))
def test_masked_local_attention_matches_the_banded_route(local_window, is_causal, attend_to_self, padded):
    q, k, v = (torch.randn(2, 3, 13, 8, requires_grad=True) for _ in range(3))
    key_mask = None
    if padded:  # left padding on sample 0, right padding on sample 1
        key_mask = torch.ones(2, 13, dtype=torch.bool)
        key_mask[0, :4], key_mask[1, -3:] = False, False
    visibility = Visibility(is_causal, attend_to_self, local_window)
    probe = torch.randn(2, 3, 13, 8)
    results = {}
    for route in (masked_local_attention, local_attention):
        out = route(q, k, v, visibility, key_mask, 8**-0.5)
        results[route] = out, torch.autograd.grad((out * probe).sum(), (q, k, v))
    (masked_out, masked_grads), (banded_out, banded_grads) = results.values()
    torch.testing.assert_close(masked_out, banded_out, atol=1e-5, rtol=1e-5)
    for masked_grad, banded_grad in zip(masked_grads, banded_grads, strict=True):
        torch.testing.assert_close(masked_grad, banded_grad, atol=1e-4, rtol=1e-4)


def test_masked_models_are_the_local_models_on_masked_sdpa():
    shape = Shape(n_layer=2, n_embd=32, n_head=4, vocab_size=50, n_positions=32)
    input_ids = torch.randint(50, (2, 24))
    logits, routes = {}, {}
    for name in ("local-4", "local-4 masked"):
        torch.manual_seed(0)
        model = build_model(name, shape).eval()
        logits[name] = model(input_ids).logits
        routes[name] = {m.kernels["local"] for m in model.modules() if isinstance(m, HfAttnAttention)}
    assert routes == {"local-4": {local_attention}, "local-4 masked": {masked_local_attention}}
    torch.testing.assert_close(logits["local-4 masked"], logits["local-4"], atol=1e-5, rtol=1e-5)


# --- the benchmark modules -------------------------------------------------------------------------------------


def test_attention_layer_benchmark_times_and_checks_every_kernel(capsys):
    attention_layer.main([
        "--lengths", "40", "80", "--windows", "1", "33", "--batch", "1", "--heads", "2", "--head-dim", "8",
        "--repeats", "1", "--dtypes", "fp32", "bf16", "--kernels", *attention_layer.KERNELS, "--check",
        "--compile-backend", "eager", "--max-masked-length", "40",
    ])  # fmt: skip
    rows = table_rows(capsys.readouterr().out, width=3 + 1 + 2 * 4 + 4)
    assert [(dtype, int(length), int(k)) for dtype, length, k, *_ in rows] == list(
        itertools.product(["fp32", "bf16"], [40, 80], [1, 33])
    )
    for _, length, _, masked, banded, speedup, compiled, _, flex, _, global_, _, *checks in rows:
        assert float(banded) > 0 and float(compiled) > 0 and float(global_) > 0
        assert flex.endswith("forward only")  # FlexAttention has no backward on CPU
        if length == "40":
            assert float(masked) > 0 and speedup.endswith("x")
            assert all(check.startswith("PASS") for check in checks), checks
            assert checks[-1].endswith("forward only)")
        else:  # beyond --max-masked-length: no T x T mask, so no masked figure and no reference
            assert masked == "not run: T x T mask" and speedup == "-"
            assert set(checks) == {"no reference: T x T mask not run"}


def test_generation_benchmark_runs_and_caches_grow_as_expected():
    contexts = [str(length) for length in CONTEXTS]
    result = run_benchmark("generation", "--contexts", *contexts, "--new-tokens", "3", *TINY)
    assert result.returncode == 0, result.stderr
    rows = {(cells[0], int(cells[1])): cells for cells in table_rows(result.stdout, width=6)}
    assert set(rows) == {(model, length) for model in MODELS for length in CONTEXTS}, result.stdout
    cache_mib = {key: float(cells[5]) for key, cells in rows.items()}
    for model in ("local-1", "local-4"):
        assert cache_mib[model, 16] == cache_mib[model, 32] > 0
    assert cache_mib["local-4", 16] == pytest.approx(4 * cache_mib["local-1", 16], rel=1e-3)  # the last k tokens
    assert cache_mib["gpt2", 32] > cache_mib["gpt2", 16]
    assert cache_mib["hybrid-1", 32] > cache_mib["hybrid-1", 16]
    assert cache_mib["positional", 32] > cache_mib["positional", 16]  # values of every token, no keys
    for cells in rows.values():
        assert float(cells[2]) > 0  # ms/token
    assert "local-1: ms/token 32/16" in result.stdout
    assert "positional: ms/token 32/16" in result.stdout and "(values only, " in result.stdout
    assert "gpt2: cache 32/16" in result.stdout


def test_positional_routes_benchmark_times_every_route_and_names_auto_s_choice():
    sizes = ["--paper-a-batches", "300", "--lengths", "256", "--tokens-per-step", "256", "--repeats", "1"]
    result = run_benchmark("positional_routes", *sizes)
    assert result.returncode == 0, result.stderr
    rows = {cells[0]: cells for cells in table_rows(result.stdout, width=9)}
    assert set(rows) == {"Paper A", "language model"}, result.stdout
    assert rows["Paper A"][1:3] == ["300", "8"] and rows["language model"][1:3] == ["1", "256"]
    # the rule, as measured: batch 300 > 8 / 128 shares the weights; batch 1 < 256 / 128 fuses
    assert rows["Paper A"][7] == "shared_weights" and rows["language model"][7] == "fused"
    for cells in rows.values():
        assert all(float(ms) > 0 for ms in cells[3:6]) and cells[6].endswith("x")


def test_unknown_model_is_refused_with_the_choices():
    result = run_benchmark("generation", "--models", "local-2", *TINY)
    assert result.returncode != 0
    assert "invalid choice: 'local-2'" in result.stderr and "hybrid-1" in result.stderr


def test_throughput_benchmark_reports_ratios_and_linear_layer_memory():
    result = run_benchmark(
        "throughput", "--models", "local-1", "--lengths", "32", "--tokens-per-step", "64",
        "--repeats", "1", "--layer-lengths", "4096", "16384", "--max-masked-length", "0", *TINY,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    speed = {cells[0]: cells for cells in table_rows(result.stdout, width=8)}
    assert set(speed) == {"gpt2", "local-1"}, result.stdout
    assert speed["gpt2"][5] == "1.00x" and speed["local-1"][5].endswith("x")
    assert all(int(cells[6]) > 0 for cells in speed.values())  # peak MiB, each in a fresh process
    layer = {int(cells[0]): cells for cells in table_rows(result.stdout, width=4)}
    banded = {length: float(cells[1]) for length, cells in layer.items()}
    scores = {length: float(cells[3]) for length, cells in layer.items()}
    assert scores[16384] == 16 * scores[4096] == 8 * 16384 * 16384 * 4 / 2**20  # what a T x T matrix would take
    assert banded[16384] < scores[16384] / 50  # the banded layer holds O(T) tensors, never O(T^2)
    assert {cells[2] for cells in layer.values()} == {"not run"}  # masked SDPA beyond --max-masked-length


# --- the GPU runner --------------------------------------------------------------------------------------------


def test_gpu_plan_is_the_same_steps_at_both_sizes_and_every_command_parses(capsys):
    assert [step.name for step in gpu.plan(gpu.TINY)] == gpu.STEP_NAMES
    for tiny in ([], ["--tiny"]):
        gpu.main(["--dry-run", *tiny])
        listed = capsys.readouterr().out
        for step in gpu.plan(gpu.TINY if tiny else gpu.GPU):
            assert f"- {step.name}, ~{step.seconds:.0f} s: `{step.command}`" in listed
    assert "--device cuda" in gpu.plan(gpu.GPU)[0].argv and "--device cpu" in gpu.plan(gpu.TINY)[0].argv


def fake_step(name: str, seconds: float, clock: list[float], takes: float, ran: list[str], fails: bool = False):
    """A step whose benchmark advances the fake clock by `takes` seconds, and raises if `fails`."""

    def main(argv: list[str]) -> None:
        ran.append(name)
        clock[0] += takes
        if fails:
            raise RuntimeError(f"{name} broke")

    return gpu.Step(name, SimpleNamespace(__name__=f"fake.{name}", main=main), "--x 1", seconds)


def test_run_plan_skips_what_would_not_fit_and_goes_on_after_a_failure(capsys):
    clock, ran = [0.0], []
    steps = [
        fake_step("first", 10, clock, takes=30, ran=ran),  # longer than estimated: 70 s left after it
        fake_step("too-long", 80, clock, takes=1, ran=ran),  # skipped
        fake_step("broken", 50, clock, takes=10, ran=ran, fails=True),  # runs, fails: 60 s left
        fake_step("exact-fit", 60, clock, takes=70, ran=ran),  # runs, overruns the budget
        fake_step("nothing-left", 0, clock, takes=1, ran=ran),  # skipped: the budget is spent
    ]
    gpu.run_plan(steps, budget_seconds=100, clock=lambda: clock[0])
    assert ran == ["first", "broken", "exact-fit"]
    out = capsys.readouterr().out
    assert "Skipped: needs ~80 s, 70 s of the budget left." in out
    assert "Skipped: needs ~0 s, 0 s of the budget left." in out
    assert "RuntimeError: broken broke" in out and "python -m fake.exact-fit --x 1" in out


def test_gpu_runner_refuses_to_run_without_cuda():
    if torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    with pytest.raises(SystemExit):
        gpu.parse_args([])


def test_gpu_runner_writes_to_out_when_set_and_under_the_ignored_outputs_folder_otherwise(monkeypatch):
    monkeypatch.setenv("OUT", "/device/out")
    assert gpu.default_output() == "/device/out/gpu_benchmark.md"
    monkeypatch.delenv("OUT")
    assert gpu.default_output() == os.path.join("outputs", "benchmarks", "gpu_benchmark.md")


def test_gpu_runner_tiny_run_writes_every_step_and_a_zero_budget_skips_them(tmp_path):
    """Run as a new user does, without $OUT: the results go under `outputs/` (git-ignored) and nowhere else."""
    result = run_benchmark("gpu", "--tiny", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    output = tmp_path / "outputs" / "benchmarks" / "gpu_benchmark.md"
    assert [path for path in tmp_path.rglob("*") if path.is_file()] == [output]
    assert "/outputs/" in (ROOT / ".gitignore").read_text().splitlines()
    assert f"results appended to {os.path.join('outputs', 'benchmarks', 'gpu_benchmark.md')}" in result.stdout
    written = output.read_text()
    sections = written.split("\n## ")[1:]
    assert [section.split("\n")[0] for section in sections] == gpu.STEP_NAMES
    for section in sections:
        assert "Failed" not in section and "Skipped" not in section, section
        assert "|---|" in section, section  # every step printed its table
        assert section.split("\n")[0] in result.stdout  # teed to the console too
    gpu.main(["--tiny", "--budget-seconds", "0", "--output", str(output)])
    rerun = output.read_text()[len(written) :]
    assert rerun.count("Skipped: needs") == len(gpu.STEP_NAMES)


def test_hybrid_tradeoff_benchmark_measures_every_fraction_for_each_family(tmp_path):
    """Tiny random Llama (a GGUF file: fine-tuned too, as a float model) and GPT-2 (a folder): every fraction gets
    both selections' perplexity, the cache ratio the layout implies, a decode ratio and a fine-tune; the table and
    plot are written."""
    from gguf_files import write_llama_gguf
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    from benchmarks import hybrid_tradeoff

    torch.manual_seed(0)
    llama = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                        tie_word_embeddings=False)  # fmt: skip
    write_llama_gguf(LlamaForCausalLM(llama), tmp_path / "llama.gguf")
    GPT2LMHeadModel(GPT2Config(vocab_size=50257, n_embd=32, n_layer=2, n_head=4, n_positions=64)).save_pretrained(
        tmp_path / "gpt2"
    )
    shared = Path(__file__).parents[2] / "shared" / "data"
    tiny = [
        "--block_size",
        "32",
        "--eval_tokens",
        "256",
        "--calibration_blocks",
        "2",
        "--heal_steps",
        "2",
        "--new_tokens",
        "3",
        "--decode_context",
        "96",
        "--local_window",
        "4",
        "--fractions",
        "0",
        "0.5",
        "1",
    ]
    data = ["--tokenizer", str(shared / "gpt2-tokenizer"), "--data_dir", str(shared / "wikitext-2-raw")]
    hybrid_tradeoff.main([str(tmp_path / "llama.gguf"), str(tmp_path / "gpt2"), *data, *tiny, "--output_dir",
                          str(tmp_path / "out")])  # fmt: skip
    for name, units in (("llama", 2), ("gpt2", 4)):  # key/value groups per layer
        result = json.loads((tmp_path / "out" / name / "results.json").read_text())
        assert result["units_per_layer"] == units and len(result["scores"]) == 2
        rows = {row["fraction"]: row for row in result["rows"]}
        assert [rows[f]["cache_ratio"] for f in (0, 0.5, 1)] == [1.0, 0.5, 0.0]
        assert rows[0]["perplexity_select_heads"] == pytest.approx(result["original_perplexity"], rel=1e-5)
        assert rows[1]["perplexity_select_heads"] == rows[1]["perplexity_random"]  # all local: the same layout
        assert all(row["perplexity_healed"] > 1 for row in result["rows"])  # 0%: the control
        assert all(row["decode_ratio"] > 0 for row in result["rows"])
        assert "| 50% | 4 |" in (tmp_path / "out" / name / "results.md").read_text()
        assert (tmp_path / "out" / name / "tradeoff.png").read_bytes()[:4] == b"\x89PNG"


def test_positional_conversion_benchmark_converts_heals_and_rewrites_its_report(tmp_path):
    """Tiny random Llama (6 query heads over 2 key/value heads, 2 layers): every layout's row, the parameters p_attn
    adds and the cache a values-only group saves; training p_attn alone lowers the held-out loss and changes the
    test perplexity; `--stored_only` rewrites results.md byte for byte from results.json."""
    from benchmarks import positional_conversion

    shared = Path(__file__).parents[2] / "shared" / "data"
    folder = tmp_path / "out"
    positional_conversion.main(["--quick", "--data_dir", str(shared / "wikitext-2-raw"), "--tokenizer",
                                str(shared / "gpt2-tokenizer"), "--output_dir", str(folder)])  # fmt: skip
    result = json.loads((folder / "results.json").read_text())
    rows = {row["layout"]: row for row in result["rows"]}
    assert list(rows) == ["unmodified", *positional_conversion.LAYOUTS]
    assert {name: row["positional_heads"] for name, row in rows.items()} == dict(
        unmodified=0, kv_group=6, last_head=2, middle_layer=6
    )
    per_head = 2 * 8 * 8 + 2 * 8  # a query and a key row of width 8 from P of width 8, with biases
    assert {name: row["added_parameters"] for name, row in rows.items()} == dict(
        unmodified=0, kv_group=6 * per_head, last_head=2 * per_head, middle_layer=6 * per_head
    )
    # 2 layers of 2 key/value heads; a group only positional heads read keeps its values, not its keys
    assert {name: row["cache_ratio"] for name, row in rows.items()} == dict(
        unmodified=1.0, kv_group=0.75, last_head=1.0, middle_layer=0.75
    )
    assert all(row["perplexity_untrained"] != rows["unmodified"]["perplexity_untrained"] for row in result["rows"][1:])
    healing = rows["kv_group"]["healing"]
    assert healing["trained_parameters"] == rows["kv_group"]["added_parameters"]
    assert healing["tokens_seen"] == 12 * 4 * 32 and [point["step"] for point in healing["curve"]] == [0, 4, 8, 12]
    assert healing["curve"][-1]["validation_loss"] < healing["curve"][0]["validation_loss"] - 0.05
    assert rows["kv_group"]["perplexity_trained"] != rows["kv_group"]["perplexity_untrained"]
    assert not any("healing" in row for name, row in rows.items() if name != "kv_group")
    assert result["protocol"] == "reduced" and set(result["machine"]["at_start"]) == {"uptime", "load_average", "idle"}
    written = (folder / "results.md").read_bytes()
    assert b"| kv_group: " in written and b"| 6 of 12 | " in written and b"| 0.750x (96 B) |" in written
    (folder / "results.md").unlink()
    positional_conversion.main(["--stored_only", "--output_dir", str(folder)])
    assert (folder / "results.md").read_bytes() == written


CONVERSION_MISSING = "does not exist (a .gguf file, a model folder, or a folder holding one .gguf file)"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--model", "/tmp/missing.gguf"], f"argument --model: /tmp/missing.gguf {CONVERSION_MISSING}"),
        (["--tokenizer", "bad name"], "argument --tokenizer: 'bad name' is neither a packaged model "
         "('smollm2-135m-instruct', 'gemma-3-270m') nor a Hub id ('name' or 'namespace/name')"),
        (["--block_size", "2"], "--block_size must be >= 4, got 2"),
        (["--heal_steps", "-1"], "--heal_steps must be >= 0, got -1"),
        (["--eval_every", "0"], "--eval_every must be >= 1, got 0"),
        (["--eval_tokens", "8", "--block_size", "16"], "--eval_tokens must be >= --block_size (16), got 8"),
        (["--learning_rate", "0"], "--learning_rate must be > 0, got 0.0"),
        (["--data_dir", "/tmp/missing-wikitext"], "--data_dir must be a folder of wiki.train.raw, wiki.valid.raw, "
         "wiki.test.raw (WikiText-2 raw) or '' for the Hub, got /tmp/missing-wikitext (no such folder)"),
    ],
)  # fmt: skip
def test_positional_conversion_refuses_bad_arguments_in_one_line_before_any_model_loads(argv, message, monkeypatch,
                                                                                        capsys):  # fmt: skip
    from benchmarks import positional_conversion

    monkeypatch.setattr(positional_conversion, "load_causal_lm", lambda *args, **kwargs: pytest.fail("loaded"))
    data_dir = ["--data_dir", str(ROOT.parent / "shared" / "data" / "wikitext-2-raw")]
    with pytest.raises(SystemExit):
        positional_conversion.main([*data_dir, *argv])
    assert message in capsys.readouterr().err.strip().splitlines()[-1]


def tiny_serving_arguments(tmp_path: Path) -> list[str]:
    """benchmarks.serving's --quick arguments for a tiny random Llama (4 query heads over 2 key/value groups, one group
    of each layer 16-local with 2 sinks, chosen by a stored score as benchmarks.long_context stores it)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=50257, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "model")
    scores = tmp_path / "layout" / "scores" / "gate-k16-s2.json"
    scores.parent.mkdir(parents=True)
    scores.write_text(json.dumps({"scores": [[0.3, 0.1], [0.05, 0.2]]}))  # lowest local: group 1, then group 0
    shared = ROOT.parent / "shared" / "data"
    return ["--quick", "--model", str(tmp_path / "model"), "--tokenizer", str(shared / "gpt2-tokenizer"),
            "--data-dir", str(shared / "wikitext-2-raw"), "--layout-dir", str(tmp_path / "layout"),
            "--local-window", "16", "--sink-tokens", "2", "--output-dir", str(tmp_path / "out")]  # fmt: skip


def test_serving_benchmark_serves_every_request_under_one_budget_and_rewrites_its_report(tmp_path):
    """--quick with --all-global on a tiny random Llama: the three models generate every token under the same cache
    bytes, the hybridized one holding at least as many requests at once; results.json has every field the report
    reads, and --report rewrites results.md byte for byte."""
    from benchmarks import serving

    folder, scores = tmp_path / "out", tmp_path / "layout" / "scores" / "gate-k16-s2.json"
    serving.main([*tiny_serving_arguments(tmp_path), "--all-global"])
    result = json.loads((folder / "results.json").read_text())
    assert result["layout"] == {"name": "k16-s2-f0.5-gate", "local_groups": 2, "groups": 4, "scores": str(scores)}
    assert sorted(result["workload"]["prompt_tokens"]) == [128, 183, 238, 293, 347, 402, 457, 512]
    assert result["batching_config"]["num_blocks"] == 33  # room for 4 requests of 512 + 16 tokens, pages of 64
    runs = result["runs"]
    for run in runs.values():
        assert {key for key, *_ in serving.MEASURES} <= set(run)
        assert [request["generated_tokens"] for request in run["requests"]] == [16] * 8
        assert all(0 < request["ttft_seconds"] <= request["latency_seconds"] for request in run["requests"])
        assert 1 <= run["max_decoding"] <= run["max_active"] <= 8 and run["tokens_per_second"] > 0
        assert run["cache_bytes"] == pytest.approx(runs["unmodified"]["cache_bytes"], rel=0.05)  # one budget
        assert {"uptime", "load_average"} <= set(run["machine"]["before"]) & set(run["machine"]["after"])
    assert list(runs) == ["unmodified", "hybridized", "all_global"] and result["resumed"] == []
    assert runs["hybridized"]["max_active"] >= runs["unmodified"]["max_active"]
    assert set(result["ratios"]) == set(result["ratios_to_all_global"]) == {key for key, *_ in serving.MEASURES}
    assert result["ratios_to_all_global"]["tokens_per_second"] == pytest.approx(
        runs["hybridized"]["tokens_per_second"] / runs["all_global"]["tokens_per_second"])  # fmt: skip
    assert set(result["versions"]) >= {"transformers", "torch"} and result["command"].startswith("python -m benchmarks")
    assert result["code"]["commit"] and isinstance(result["code"]["uncommitted"], list)
    assert {"uptime", "load_average"} <= set(result["machine"]["before"]) & set(result["machine"]["after"])
    assert not (folder / "runs").exists()  # the records kept for resuming go once results.json is written
    written = (folder / "results.md").read_bytes()
    assert b"| requests decoding at once, most | " in written and b"| >= 1.8x |" in written
    assert b"| measure | unmodified | all_global | hybridized | hybridized / unmodified | target | met | " in written
    (folder / "results.md").unlink()
    serving.main(["--report", "--output-dir", str(folder)])
    assert (folder / "results.md").read_bytes() == written


def test_serving_benchmark_resumes_from_the_models_an_interrupted_run_measured(tmp_path, monkeypatch):
    """A run stopped after the unmodified model keeps its record; the same command again serves only the hybridized
    model and says so, while other arguments (another --seed) measure everything again. `serve` is replaced by one
    that records which model it was given (hybridized or not) and fails once, as an interruption would."""
    from benchmarks import serving

    served, fail_on_hybridized = [], [False, True, True]  # popped from the end: the first two runs stop

    def fake_serve(model, requests, args) -> dict:
        name = "hybridized" if getattr(model.config, "head_layout", None) else "unmodified"
        if name == "hybridized" and fail_on_hybridized.pop():
            raise KeyboardInterrupt
        served.append(name)
        return {key: 1.0 + len(served) for key, *_ in serving.MEASURES} | {"cache_bytes": 1, "requests": []}

    monkeypatch.setattr(serving, "serve", fake_serve)
    monkeypatch.setattr(serving, "hybridize", lambda model, **kwargs: setattr(model.config, "head_layout", 1))
    arguments, folder = tiny_serving_arguments(tmp_path), tmp_path / "out"
    with pytest.raises(KeyboardInterrupt):
        serving.main(arguments)
    assert served == ["unmodified"] and not (folder / "results.json").exists()
    assert json.loads((folder / "runs" / "unmodified.json").read_text())["settings"]["seed"] == 0
    with pytest.raises(KeyboardInterrupt):  # other arguments: the kept record is not theirs
        serving.main([*arguments, "--seed", "1"])
    assert served == ["unmodified", "unmodified"]
    serving.main([*arguments, "--seed", "1"])
    result = json.loads((folder / "results.json").read_text())
    assert served == ["unmodified", "unmodified", "hybridized"] and result["resumed"] == ["unmodified"]
    assert result["runs"]["unmodified"]["tokens_per_second"] == 3.0 and result["ratios"]["tokens_per_second"] == 4 / 3
    assert "earlier invocation with the same arguments: unmodified." in (folder / "results.md").read_text()
    assert not (folder / "runs").exists()


def test_serving_orders_counts_what_benchmarks_serving_counts_with_attention_computed(tmp_path, monkeypatch):
    """The cache-shaped model with attention skipped schedules the tiny workload as benchmarks.serving's own run of
    the real model does: for two orders, each model's most requests decoding and holding cache, forwards and
    preemptions are the same; each model is served once an order; the report gives each order's ratio, rewritten
    byte for byte by --report."""
    from benchmarks import serving, serving_orders

    arguments = tiny_serving_arguments(tmp_path)
    workload = arguments[: arguments.index("--output-dir")]  # serving_orders' own --output-dir
    folder, serve, calls = tmp_path / "orders", serving.serve, []
    with monkeypatch.context() as patch:
        patch.setattr(serving, "serve", lambda *args: calls.append(1) or serve(*args))
        serving_orders.main([*workload, "--seeds", "0", "2", "--output-dir", str(folder)])
    assert len(calls) == 4  # two models, two orders
    result = json.loads((folder / "results.json").read_text())
    orders = result["orders"]
    assert [(order["seed"], order["held"], order["num_blocks"]) for order in orders] == [(0, 4, 33), (2, 4, 33)]
    for order in result["orders"]:
        serving.main([*arguments, "--seed", str(order["seed"])])
        runs = json.loads((tmp_path / "out" / "results.json").read_text())["runs"]
        assert runs["unmodified"]["forwards"] > 1
        for name in serving_orders.MODELS:
            assert order[name] == {key: runs[name][key] for key in serving_orders.COUNTS}, (order["seed"], name)
    written = (folder / "results.md").read_bytes()
    ratios = [order["hybridized"]["max_decoding"] / order["unmodified"]["max_decoding"] for order in result["orders"]]
    assert f"| 4 | 33 | 2 | {result['orders'][1]['unmodified']['max_decoding']} | ".encode() in written
    assert f"over 2 orders (median {(ratios[0] + ratios[1]) / 2:.2f}x)".encode() in written
    assert not (folder / "runs").exists()
    (folder / "results.md").unlink()
    serving_orders.main(["--report", "--output-dir", str(folder)])
    assert (folder / "results.md").read_bytes() == written


def test_serving_orders_resumes_from_the_orders_an_interrupted_run_measured(tmp_path, monkeypatch):
    """A run stopped after its first order keeps that order's record; the same command again measures only the
    other, and the report says which came from the earlier invocation."""
    from benchmarks import serving_orders

    measured, stop = [], [False, True, False]  # popped from the end: the first run stops at its second order

    def fake_measure(args, seed, held, config, tokenizer) -> dict:
        if stop.pop():
            raise KeyboardInterrupt
        measured.append(seed)
        counts = {"max_decoding": 2 + seed, "max_active": 3, "forwards": 10, "preempted": 0}
        machine = {"before": {"uptime": "u"}, "after": {"uptime": "v"}}
        return {"seed": seed, "held": held, "num_blocks": 33, "prompt_tokens": [], "unmodified": counts,
                "hybridized": counts, "seconds": 60.0, "machine": machine}  # fmt: skip

    monkeypatch.setattr(serving_orders, "measure", fake_measure)
    arguments = tiny_serving_arguments(tmp_path)
    argv = [*arguments[: arguments.index("--output-dir")], "--seeds", "0", "1", "--output-dir", str(tmp_path / "o"),
            "--threads", "1"]  # fmt: skip
    threads = torch.get_num_threads()
    try:
        with pytest.raises(KeyboardInterrupt):
            serving_orders.main(argv)
        serving_orders.main(argv)
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(threads)
    assert measured == [0, 1]
    report = (tmp_path / "o" / "results.md").read_text()
    assert "2.0 min for the 2 orders" in report
    assert "earlier invocation with the same arguments: held 4, seed 0." in report


@pytest.mark.parametrize(("argv", "message"), [
    (["--seeds", "-1"], "--seeds must be 0 or more, got -1"),
    (["--held", "0"], "--held must be 1 or more, got 0"),
    (["--num-blocks", "64"], "--num-blocks and --seed are set here for each budget and order: use --held and --seeds"),
    (["--fraction", "2"], "--fraction must be in (0, 1], got 2.0"),  # benchmarks.serving's own check
])  # fmt: skip
def test_serving_orders_refuses_bad_arguments_naming_the_flag(argv, message, capsys):
    from benchmarks import serving_orders

    with pytest.raises(SystemExit):
        serving_orders.main(argv)
    assert message in capsys.readouterr().err


@pytest.mark.xdist_group("serving")  # with tests/test_serving_http.py: each server takes both cores while it starts
def test_serving_http_benchmark_answers_every_client_and_rewrites_its_report(tmp_path):
    """--quick end to end: a tiny random Llama saved unmodified and hybridized, served in turn by `transformers serve`
    and by hf_attn's server under the same flags, 12 streamed completions from 4 clients each; every request gets
    all its tokens, no error, every field the report reads is there, and --report rewrites results.md byte for
    byte."""
    from benchmarks import serving_http

    data, folder, checkpoints = ROOT.parent / "shared" / "data" / "wikitext-2-raw", tmp_path / "out", tmp_path / "ckpt"
    serving_http.main(["--quick", "--threads", "1", "--data-dir", str(data), "--output-dir", str(folder),
                       "--checkpoint-dir", str(checkpoints)])  # fmt: skip
    result = json.loads((folder / "results.json").read_text())
    assert result["model"] == "tiny-random-llama" and result["family"] == "llama" and result["dtype"] == "float32"
    assert (result["layers"], result["heads"], result["key_value_heads"]) == (2, 4, 2) and result["parameters"] > 0
    assert result["layout"] == {"name": "k32-s2-f0.5-random-seed0", "local_groups": 2, "groups": 4, "scores": None}
    workload = result["workload"]
    assert {k: v for k, v in workload.items() if k != "prompt_tokens"} == {"requests": 12, "clients": 4,
            "new_tokens": 16, "text": "WikiText-2 test", "endpoint": "/v1/completions"}  # fmt: skip
    assert len(workload["prompt_tokens"]) == 12 and all(60 <= n <= 270 for n in workload["prompt_tokens"])
    # 17 blocks: room for 4 requests of 256 + 16 tokens in pages of 64
    assert result["server_flags"] == {"continuous_batching": True, "cb_num_blocks": 17, "cb_block_size": 64,
                                      "cb_max_batch_tokens": 1024, "device": "cpu", "dtype": "float32",
                                      "threads": 1}  # fmt: skip
    runs = result["runs"]
    assert set(runs) == {"unmodified", "hybridized"}
    for name, run in runs.items():
        assert {key for key, _ in serving_http.MEASURES} <= set(run) and run["errors"] == 0
        assert run["server"] == serving_http.SERVERS[name][0] and f" {checkpoints / name} " in run["command"]
        for flag in ("--continuous-batching", "--cb-num-blocks 17 ", "--cb-block-size 64 ", "--device cpu"):
            assert flag in run["command"]
        assert ", continuous batching, stream" in Path(run["log"]).read_text()  # the server's line per request
        requests = run["requests"]
        assert sorted(request["index"] for request in requests) == list(range(12))
        assert {request["client"] for request in requests} == set(range(4))
        assert [request["prompt_tokens"] for request in requests] == workload["prompt_tokens"]  # the server's count
        assert all(request["generated_tokens"] == 16 and request["error"] is None for request in requests)
        assert all(0 < r["ttft_seconds"] <= r["latency_seconds"] and r["end"] <= run["wall_seconds"] for r in requests)
        assert run["generated_tokens"] == 12 * 16
        assert run["tokens_per_second"] == pytest.approx(run["generated_tokens"] / run["wall_seconds"])
        assert 0 < run["ttft_p50_seconds"] <= run["ttft_p95_seconds"] and run["startup_seconds"] > 0
        assert 0 < run["latency_p50_seconds"] <= run["latency_p95_seconds"] <= run["wall_seconds"]
        assert {"uptime", "load_average"} <= set(run["machine"]["before"]) & set(run["machine"]["after"])
    assert result["ratios"]["errors"] is None  # 0 errors: no ratio
    assert result["ratios"]["generated_tokens"] == 1.0
    assert set(result["ratios"]) == {key for key, _ in serving_http.MEASURES}
    assert set(result["versions"]) >= {"transformers", "torch", "httpx", "fastapi", "uvicorn", "python"}
    assert result["command"].startswith("python -m benchmarks.serving_http --quick")
    assert result["code"]["commit"] and isinstance(result["code"]["uncommitted"], list)
    assert {"uptime", "load_average"} <= set(result["machine"]["before"]) & set(result["machine"]["after"])
    assert result["settings"]["quick"] and result["wall_seconds"] > 0
    for name in runs:  # each checkpoint with its tokenizer
        assert (checkpoints / name / "config.json").is_file() and (checkpoints / name / "tokenizer.json").is_file()
    written = (folder / "results.md").read_bytes()
    assert b"| generated tokens/s | " in written and b"| errors | 0 | 0 | - |" in written
    (folder / "results.md").unlink()
    serving_http.main(["--report", "--output-dir", str(folder)])
    assert (folder / "results.md").read_bytes() == written


def test_hybrid_speed_benchmark_measures_every_model_and_rewrites_its_report(tmp_path, monkeypatch):
    """--quick end to end, each measurement in this process rather than a fresh one (the spawning is all that is
    left out): every length, dtype and batch has both models' figures; the hybridized tiny Llama's cache holds less
    at 128 tokens (half its key/value groups 16-local with 4 sinks); each capacity is a batch that fits the budget
    with one more that does not; --report rewrites results.md byte for byte."""
    from benchmarks import hybrid_speed

    monkeypatch.setattr(hybrid_speed, "in_fresh_process", hybrid_speed.measure)
    folder = tmp_path / "out"
    hybrid_speed.main(["--quick", "--output-dir", str(folder)])
    result = json.loads((folder / "results.json").read_text())
    assert list(result["models"]) == ["unmodified", "k16"] and result["models"]["k16"]["local_groups"] == 2
    assert set(result["peaks"]) == {"float32", "bfloat16"} and list(result["batches"]) == ["1", "4"]
    for figures in [*result["peaks"]["float32"].values(), *result["peaks"]["bfloat16"].values()]:
        assert figures["k16"]["cache_bytes"] < figures["unmodified"]["cache_bytes"]
        assert all(figures[name]["peak_bytes"] >= figures[name]["decode_peak_bytes"] >= 0 for name in figures)
    assert all(figures[name]["prefill_seconds"] > 0 for figures in result["lengths"].values() for name in figures)
    one, four = (result["batches"][batch]["memory"]["unmodified"]["cache_bytes"] for batch in ("1", "4"))
    assert four == 4 * one
    for name, at in result["capacity"].items():
        assert at["batch"] >= 1 and at["decode_peak_bytes"] <= result["budget_bytes"], name
        assert at["probed"][str(at["batch"] + 1)]["decode_peak_bytes"] > result["budget_bytes"], name
        assert at["tokens_per_second"] == pytest.approx(at["batch"] * 1000 / at["timing"]["decode_ms"])
    written = (folder / "results.md").read_bytes()
    assert b"| k16: sequences decoded within the budget | " in written and b"| >= 1.8x |" in written
    (folder / "results.md").unlink()
    hybrid_speed.main(["--report", "--output-dir", str(folder)])
    assert (folder / "results.md").read_bytes() == written


@pytest.mark.parametrize("budget,expected", [(1000, 90), (105, 0), (110, 1), (10_000, 990)])
def test_capacity_search_finds_the_largest_batch_that_fits(budget, expected, monkeypatch):
    """A decoding peak of 100 + 10 per row, predicted from two batches whose peaks mislead (the first is high): the
    search still ends on the batch that fits with the next one failing, or on none."""
    from benchmarks import hybrid_speed
    from benchmarks.common import EXACT_MEMORY

    probed = []

    def fake(spec: dict) -> dict:
        probed.append(spec["batch"])
        assert spec["allocator"] == EXACT_MEMORY
        return {"decode_peak_bytes": 100 + 10 * spec["batch"]}

    monkeypatch.setattr(hybrid_speed, "in_fresh_process", fake)
    batches = {1: {"decode_peak_bytes": 150}, 4: {"decode_peak_bytes": 160}}
    found = hybrid_speed.capacity({}, batches, budget, context=8)
    assert found["batch"] == expected and len(probed) == len(set(probed)) <= 30
    if expected:
        assert found["decode_peak_bytes"] == 100 + 10 * expected and str(expected + 1) in found["probed"]


def test_a_fresh_process_starts_with_the_allocator_asked_for_and_no_other(monkeypatch):
    """The spawned process sees MALLOC_MMAP_THRESHOLD_ (glibc reads it at start) only when measuring memory, and no
    LD_PRELOAD of this process's unless asked; this process's environment is left as it was."""
    from benchmarks.common import DEFAULT_ALLOCATOR, EXACT_MEMORY, MALLOC_MMAP_THRESHOLD, in_fresh_process

    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "999")
    monkeypatch.setenv("LD_PRELOAD", "libm.so.6")
    assert in_fresh_process(os.getenv, "MALLOC_MMAP_THRESHOLD_", EXACT_MEMORY) == MALLOC_MMAP_THRESHOLD
    assert in_fresh_process(os.getenv, "LD_PRELOAD", EXACT_MEMORY) is None
    assert in_fresh_process(os.getenv, "MALLOC_MMAP_THRESHOLD_", DEFAULT_ALLOCATOR) is None
    assert in_fresh_process(os.getenv, "LD_PRELOAD", {"LD_PRELOAD": "libm.so.6"}) == "libm.so.6"
    assert os.environ["MALLOC_MMAP_THRESHOLD_"] == "999" and os.environ["LD_PRELOAD"] == "libm.so.6"


def test_a_preloaded_library_counts_only_when_the_process_mapped_it(monkeypatch):
    """The loader only warns about a library in LD_PRELOAD it cannot find: the check reads what the process mapped."""
    from benchmarks.common import preloaded_library

    monkeypatch.setenv("LD_PRELOAD", "libm.so.6")  # mapped by Python itself
    assert Path(preloaded_library()).name == "libm.so.6"
    monkeypatch.setenv("LD_PRELOAD", "libhf_attn_no_such_allocator.so")
    assert preloaded_library() is None
    monkeypatch.delenv("LD_PRELOAD")
    assert preloaded_library() is None


def test_glibc_heap_counts_what_it_maps_apart_from_the_heap():
    """A block above glibc's largest mmap threshold (32 MiB), and larger than all the heap holds free (else malloc
    may serve it from there), is mapped on its own, and mallinfo2 counts it there, not in the heap."""
    from benchmarks.common import glibc_heap

    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    before = glibc_heap()
    assert before is not None and before["heap_bytes"] >= before["heap_in_use_bytes"] > 0
    size = 64 * 2**20 + before["heap_bytes"] - before["heap_in_use_bytes"]
    block = libc.malloc(size)  # untouched: mapped, not resident
    after = glibc_heap()
    libc.free(block)
    assert block and after["mapped_bytes"] - before["mapped_bytes"] >= size
    assert abs(after["heap_in_use_bytes"] - before["heap_in_use_bytes"]) < 2**20


def test_allocators_benchmark_measures_each_model_under_each_allocator_and_rewrites_its_report(tmp_path, monkeypatch):
    """--quick under glibc's two settings, each measurement in this process rather than a fresh one: both models under
    both, every figure there, the heap table from glibc's runs; --report rewrites results.md byte for byte."""
    from benchmarks import allocators, hybrid_speed

    monkeypatch.setattr(allocators, "in_fresh_process", hybrid_speed.measure)
    folder = tmp_path / "out"
    allocators.main(["--quick", "--allocators", "glibc", "glibc-mmap-128k", "--output-dir", str(folder)])
    result = json.loads((folder / "results.json").read_text())
    assert list(result["allocators"]) == ["glibc", "glibc-mmap-128k"]
    for models in result["allocators"].values():
        assert list(models) == ["unmodified", "k16"]
        assert all(figures["prefill_seconds"] > 0 and figures["peak_bytes"] >= 0 for figures in models.values())
        assert models["k16"]["cache_bytes"] < models["unmodified"]["cache_bytes"]
    heap = result["allocators"]["glibc"]["k16"]["runs"][0]["glibc_heap"]
    assert heap["heap_bytes"] >= heap["heap_in_use_bytes"] > 0
    written = (folder / "results.md").read_bytes()
    assert b"| glibc's defaults (a user's process) | " in written
    assert b"| model | heap | in use | kept free |" in written
    (folder / "results.md").unlink()
    allocators.main(["--report", "--output-dir", str(folder)])
    assert (folder / "results.md").read_bytes() == written


def test_allocators_benchmark_refuses_an_allocator_that_is_missing_or_was_not_loaded(tmp_path, monkeypatch, capsys):
    """One not installed is an argument error naming it and what is installed; one whose library a process did not
    map (the loader only warns) stops the run rather than be reported as measured."""
    from benchmarks import allocators, hybrid_speed

    monkeypatch.setattr(allocators, "installed_allocators", lambda: dict(allocators.GLIBC))
    with pytest.raises(SystemExit):
        allocators.parse_args(["--quick", "--allocators", "tcmalloc"])
    assert "--allocators tcmalloc: not installed" in capsys.readouterr().err
    monkeypatch.setattr(allocators, "installed_allocators", lambda: {"jemalloc": {"LD_PRELOAD": "libnone.so"}})
    monkeypatch.setattr(allocators, "in_fresh_process", hybrid_speed.measure)  # this process preloads nothing
    with pytest.raises(RuntimeError, match="jemalloc was not loaded"):
        allocators.main(["--quick", "--allocators", "jemalloc", "--output-dir", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()


def test_revision_speed_times_both_revisions_beside_the_unmodified_model_in_alternating_order(tmp_path):
    """Two rounds on a tiny Llama against HEAD: each round has a record of all three, in reversed order the second
    time, and the revision timed is the commit named (from `git archive`, not the working tree); a name that is no
    commit is refused before anything loads."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from benchmarks import revision_speed

    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)  # fmt: skip
    LlamaForCausalLM(config).save_pretrained(tmp_path / "tiny")
    output = tmp_path / "speed.json"
    revision_speed.main(["HEAD", "--model", str(tmp_path / "tiny"), "--local_windows", "4", "--sink_tokens", "1",
                         "--rounds", "2", "--prefill_context", "24", "--timing_context", "40", "--decode_steps", "4",
                         "--threads", "1", "--output", str(output)])  # fmt: skip
    result = json.loads(output.read_text())
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True)
    assert result["revision"] == head.stdout.strip()
    (shape,) = result["shapes"].values()
    orders = [list(record) for record in shape["rounds"]]
    assert orders == [["unmodified", "current", "revision"], ["revision", "current", "unmodified"]]
    for record in shape["rounds"]:
        assert all(run["prefill_seconds"] > 0 and run["decode_ms"] > 0 for run in record.values())
        assert (
            record["current"]["cache_bytes"] == record["revision"]["cache_bytes"] < record["unmodified"]["cache_bytes"]
        )
    assert set(shape) == {"rounds", "prefill_seconds", "decode_ms"}
    with pytest.raises(SystemExit, match="revision must name a commit"):
        revision_speed.main(["no-such-revision", "--model", str(tmp_path / "tiny"), "--output", str(output)])
