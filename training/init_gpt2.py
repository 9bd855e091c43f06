"""Write a randomly initialised GPT-2 checkpoint folder (with its tokenizer) for offline baseline runs.

Pretrained GPT-2 weights need the Hub. Offline, this makes a stand-in with GPT-2's architecture and tokenizer so
the baseline code path runs end to end; its results are those of a GPT-2 trained from scratch on the task, not of
the pretrained model Paper A fine-tunes. Online, pass `--baseline_model gpt2-large` to the scripts instead.

    python -m training.init_gpt2 --tokenizer ../shared/data/gpt2-tokenizer --output checkpoints/gpt2-scratch
"""

import argparse

from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, set_seed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", required=True, help="GPT-2 tokenizer folder or Hub id")
    parser.add_argument("--output", required=True, help="folder to write the checkpoint into")
    parser.add_argument("--n_layer", type=int, default=4)
    parser.add_argument("--n_embd", type=int, default=128)
    parser.add_argument("--n_head", type=int, default=4)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
    )  # fmt: skip
    GPT2LMHeadModel(config).save_pretrained(args.output)
    tokenizer.save_pretrained(args.output)
    print(f"wrote a randomly initialised GPT-2 ({config.n_layer} layers, width {config.n_embd}) to {args.output}")


if __name__ == "__main__":
    main()
