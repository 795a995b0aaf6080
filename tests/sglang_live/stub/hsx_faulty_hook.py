"""A deliberately broken dump hook for the live spot-check test (tests/sglang_live/test_spot_check.py):
the real hook of ``hsextract.capture.sglang.hook``, handed every aux state one slot late. With
consecutive layer ids (``[1, 2, 3]``) that is one layer late: the dump says layer 1 and holds layer
2's output, as a hook registered one decoder layer off would. On the server's PYTHONPATH (the stub
directory), named in ``--forward-hooks`` in place of ``make_hook``."""

from __future__ import annotations

from typing import Any

import torch

from hsextract.capture.sglang.hook import Hook, make_hook


def make_aux_late_hook(config: dict[str, Any]) -> Hook | None:
    hook = make_hook(config)
    if hook is None:
        return None
    real = hook

    def late(module: torch.nn.Module, args: tuple[Any, ...], output: Any) -> None:
        aux = args[4] if len(args) > 4 else None
        if aux is not None:
            if isinstance(aux, torch.Tensor):  # packed [n, K*H]
                width = int(args[1].shape[-1])
                slots = aux.reshape(aux.shape[0], -1, width)
                aux = torch.cat([slots[:, 1:], slots[:, -1:]], dim=1).reshape(aux.shape[0], -1)
            else:
                aux = [*list(aux)[1:], list(aux)[-1]]
            args = (*args[:4], aux, *args[5:])
        real(module, args, output)

    return late
