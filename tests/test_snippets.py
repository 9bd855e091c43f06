"""Every Python block of README.md and docs/*.md runs as it stands, so an example cannot rot.

A page's blocks run in order in one namespace, as a reader pastes them one after another, in a fresh folder with
`../shared` beside it (as beside a clone). Blocks whose first line is `# needs the Hub` are the only ones not run;
a block that loads the quickstart's model gets a tiny quickstart run made first.
"""

import re
from pathlib import Path

import pytest
import torch

import training.algorithmic as algorithmic
from training.reports import PAGES, ROOT

HUB_ONLY = "# needs the Hub"
QUICKSTART_MODEL = "outputs/quickstart/"


def python_blocks(page: Path) -> list[str]:
    return re.findall(r"^```python\n(.*?)^```", page.read_text(), flags=re.DOTALL | re.MULTILINE)


def offline_blocks(page: Path) -> list[str]:
    return [block for block in python_blocks(page) if not block.startswith(HUB_ONLY)]


def make_tiny_quickstart() -> None:
    """The quickstart's command at tiny sizes, writing where the real one does (outputs/quickstart, relative)."""
    tiny = ["--train_samples", "200", "--test_samples", "50", "--num_train_epochs", "1", "--scales", "1", "--seeds=0"]
    algorithmic.FAMILY.main([str(ROOT / "configs/algorithmic/min_cpu.yaml"), *tiny])


def test_pages_have_python_to_run():
    """The README shows the quickstart model, a Trainer run and loading; a Hub-only block says so on its first line."""
    assert len(offline_blocks(ROOT / "README.md")) >= 3
    for page in PAGES:
        for block in python_blocks(page):
            assert HUB_ONLY not in block or block.startswith(HUB_ONLY), f"{page.name}: mark the whole block Hub-only"


@pytest.mark.parametrize("page", [page for page in PAGES if offline_blocks(page)], ids=lambda page: page.name)
def test_page_snippets_run_offline(page, tmp_path, monkeypatch):
    clone = tmp_path / "hf_attn"
    clone.mkdir()
    (tmp_path / "shared").symlink_to(ROOT.parent / "shared")
    monkeypatch.chdir(clone)
    namespace: dict = {}
    for number, block in enumerate(offline_blocks(page), start=1):
        if QUICKSTART_MODEL in block and not Path(QUICKSTART_MODEL).exists():
            make_tiny_quickstart()
        exec(compile(block, f"{page.name}, Python block {number}", "exec"), namespace)  # noqa: S102
    if page.name == "README.md":
        assert_counting_learned(namespace["model"])


def assert_counting_learned(model) -> None:
    """The README's hybrid model continues a count, as its comments say, once saved and loaded back."""
    continued = model.generate(torch.tensor([[20, 21, 22]]), max_new_tokens=5, do_sample=False)
    assert continued.tolist() == [list(range(20, 28))]
