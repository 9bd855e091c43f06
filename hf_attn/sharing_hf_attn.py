"""Saving and pushing with a model card, for hf_attn's models and hybridized ones, and `is_remote_code` per model.

The card's templates live in `hf_attn.hub`, which is not exported with remote code: where this code runs without
hf_attn, saving and pushing are transformers' own.
"""

import os
from collections.abc import Callable
from typing import ClassVar, Protocol

from transformers import PreTrainedModel


class Sharing(Protocol):
    """What hf_attn adds to saving and pushing where it is installed: `hf_attn.hub`, whose model card templates are
    not exported with this code."""

    def write_model_type_card(self, model: PreTrainedModel, folder: str | os.PathLike) -> object: ...

    def push_model(self, model: PreTrainedModel, repo_id: str, **push_kwargs) -> object: ...


# `save_pretrained`'s arguments that belong to its push (`push_to_hub=True`), as `push_to_hub` names them.
PUSH_ARGUMENTS = ("repo_id", "commit_message", "commit_description", "private", "token", "revision", "create_pr",
                  "tags")  # fmt: skip


class RemoteCodeQuery:
    """`is_remote_code()` asked of a model answers for that model, asked of a class for the class. transformers asks
    both (the class when loading, the model when saving); `enable_remote_code` marks one model, not its class."""

    def __get__(self, model, model_class) -> Callable[[], bool]:
        return lambda: (model_class if model is None else model)._auto_class is not None


class CardSharing:
    """`save_pretrained` and `push_to_hub` that write the model's card, for hf_attn's models and hybridized ones."""

    # Set to `hf_attn.hub` when hf_attn is imported. Where this file runs as remote code without hf_attn it stays None,
    # and saving and pushing are transformers' own (without a card: the templates are not exported).
    sharing: ClassVar[Sharing | None] = None

    def save_pretrained(self, save_directory: str | os.PathLike, is_main_process: bool = True, *args, **kwargs):
        """transformers' `save_pretrained`, then, where hf_attn is installed, the model card as README.md.

        With `push_to_hub=True` the push is `push_to_hub`'s (transformers' arguments: `repo_id`, by default the
        folder's name, `commit_message`, `private`, `token`, ...), so the Hub gets this model's card too, not the
        generic one transformers would upload."""
        push = self.sharing is not None and is_main_process and kwargs.pop("push_to_hub", False)
        hub_kwargs = {name: kwargs.pop(name) for name in PUSH_ARGUMENTS if name in kwargs} if push else {}
        super().save_pretrained(save_directory, is_main_process, *args, **kwargs)
        if self.sharing is not None and is_main_process:
            self.sharing.write_model_type_card(self, save_directory)
        if push:
            repo_id = hub_kwargs.pop("repo_id", os.path.basename(os.path.normpath(save_directory)))
            max_shard_size = kwargs.get("max_shard_size", "50GB")
            self.push_to_hub(repo_id, max_shard_size=max_shard_size, **hub_kwargs)

    def push_to_hub(self, repo_id: str, **kwargs):
        """transformers' `push_to_hub`, with this model's card in place of the generic one where hf_attn is installed
        (`hf_attn.hub.push_model`)."""
        if self.sharing is None:
            return super().push_to_hub(repo_id, **kwargs)
        return self.sharing.push_model(self, repo_id, **kwargs)
