"""speculators 0.9.0's own trainer on our speculators-format output, and its drafter's guesses.

* ``train_argv``: ``python -m speculators train`` (the wheel's own CLI: ``speculators.cli.train``,
  ``TrainConfig.resolve`` then ``speculators.train.cli.main``) with the flags the output's
  ``data_config.json`` gives (``trainer.flags``: ``--data-path``, ``--hidden-states-path``,
  ``--on-missing``, ``--total-seq-len``, ``--target-layer-ids``, FP8's ``--hidden-states-backend``),
  ``--draft-vocab-size`` (the draft vocabulary speculators builds from ``<data-path>/token_freq.pt``),
  and the training length. Nothing of the trainer is re-implemented: it runs as a subprocess.
* ``Drafter``: the checkpoint it saved, loaded with speculators' own ``Eagle3DraftModel``, and
  ``draft_tokens``: its ``forward`` with ``ttt_steps=k`` (the training-time-test unroll: each step
  after the first runs on the drafter's own hidden output), its draft-vocabulary argmax mapped to
  target ids with the checkpoint's ``d2t``.

The trainer refuses the CPU: ``speculators/train/trainer.py`` takes ``torch.accelerator``'s device
and falls back to ``"cuda"`` when there is none.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import torch

#: the TTT unroll used in training and the number of guesses measured (speculators' default)
TTT_STEPS = 3


def trainer_flags(output: Path) -> dict[str, Any]:
    """The trainer flags ``hsextract extract`` recorded for this output, paths made absolute."""
    config = json.loads((output / "data_config.json").read_text())
    flags = dict(config["trainer"]["flags"])
    for flag in ("--data-path", "--hidden-states-path"):
        flags[flag] = str((output / flags[flag]).resolve())
    return flags


def train_argv(
    output: Path,
    target: Path,
    save_dir: Path,
    *,
    draft_vocab_size: int,
    epochs: int,
    lr: float,
    target_layer_ids: list[int] | None = None,
    seed: int = 0,
) -> list[str]:
    """The released CLI's command line; ``target_layer_ids`` overrides the recorded ones (the
    layer-off drafter: trained on one layer set, configured, hence served, for another)."""
    flags = trainer_flags(output)
    if target_layer_ids is not None:
        flags["--target-layer-ids"] = target_layer_ids
    argv = [sys.executable, "-m", "speculators", "train", "--speculator-type", "eagle3"]
    argv += ["--verifier-name-or-path", str(target)]
    for flag, value in flags.items():
        argv += [flag, *map(str, value)] if isinstance(value, list) else [flag, str(value)]
    argv += [
        "--draft-vocab-size", str(draft_vocab_size),
        "--num-layers", "1",
        "--ttt-steps", str(TTT_STEPS),
        # its default, the fused Triton loss, does not compile under torch 2.11's dynamo (the
        # forward is torch.compile'd): "ListVariable ... is already tracked for mutation" on the
        # kernels' autotune configs. The eager loss is the same KL divergence in plain torch.
        "--loss-implementation", "eager",
        "--epochs", str(epochs),
        "--lr", str(lr),
        "--scheduler-type", "cosine",
        "--scheduler-warmup-ratio", "0.05",
        "--train-data-ratio", "0.95",
        "--num-workers", "4",
        "--seed", str(seed),
        "--save-path", str(save_dir),
        "--log-dir", str(save_dir / "logs"),
        "--log-freq", "50",
        "--no-resume-from-checkpoint",
    ]  # fmt: skip
    return argv


def last_checkpoint(save_dir: Path) -> Path:
    """The last epoch's checkpoint (speculators writes ``<save_path>/<epoch>/``)."""
    epochs = sorted((p for p in save_dir.iterdir() if p.is_dir() and p.name.isdigit()), key=lambda p: int(p.name))
    if not epochs:
        raise FileNotFoundError(f"speculators wrote no checkpoint under {save_dir}")
    return epochs[-1]


class Drafter:
    """A trained speculators EAGLE-3 drafter, as its own model class loads it."""

    def __init__(self, checkpoint: Path, target: Path, device: torch.device) -> None:
        from speculators.models.eagle3 import Eagle3DraftModel, Eagle3SpeculatorConfig

        self.checkpoint = checkpoint
        # Measured with dense (sdpa) attention, as the CLI's --from-pretrained path re-applies an
        # attention choice: flex attention's block masks are built for the 128-multiple lengths
        # training packs to, and a held-out row is of any length. The weights are the same.
        config = Eagle3SpeculatorConfig.from_pretrained(str(checkpoint))
        config.transformer_layer_config._attn_implementation = "sdpa"
        model = Eagle3DraftModel.from_pretrained(str(checkpoint), config=config, verifier=str(target))
        self.model = model.to(device).eval()
        # its forward is torch.compile'd; one compile per row length would cost more than the measure
        forward = type(model).forward
        self._forward = getattr(forward, "_torchdynamo_orig_callable", forward)
        self.device = device
        self.config_path = checkpoint / "config.json"

    def draft_tokens(self, aux_hidden: torch.Tensor, input_ids: torch.Tensor, k: int) -> torch.Tensor:
        """``drafts [k, T]`` (``drafts[j, p]`` guesses ``x_{p+2+j}``): ``aux_hidden [T, K*H]`` are the
        target's aux states, paired as ``shift_batch`` pairs them (state ``p`` with token ``p+1``)."""
        length = input_ids.shape[0]
        hidden = aux_hidden[:-1].unsqueeze(0).to(self.device, torch.bfloat16)
        ids = input_ids[1:].unsqueeze(0).to(self.device)
        with torch.no_grad(), torch.autocast(self.device.type, dtype=torch.bfloat16):
            steps = self._forward(
                self.model,
                hidden_states=hidden,
                input_ids=ids,
                document_ids=torch.zeros_like(ids),
                position_ids=torch.arange(1, length, device=self.device).unsqueeze(0),
                ttt_steps=k,
            )
        d2t = self.model.d2t
        drafts = torch.full((k, length), -1, dtype=torch.long)
        for j, step in enumerate(steps):
            guess = step[0].long()
            if d2t is not None:
                guess = guess + d2t[guess].long()
            drafts[j, : length - 1] = guess.cpu()
        return drafts
