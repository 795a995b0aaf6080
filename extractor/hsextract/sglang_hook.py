"""Compatibility entry point for deployments that name ``hsextract.sglang_hook:make_hook`` (or
``make_prenorm_hook``) in ``--forward-hooks``. The hook lives in ``hsextract.capture.sglang.hook``;
``hsextract launch-sglang`` names that module directly."""

from hsextract.capture.sglang.hook import make_hook, make_prenorm_hook

__all__ = ["make_hook", "make_prenorm_hook"]
