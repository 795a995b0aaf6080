"""The names of the storages of hidden states, without torch: the launcher imports them (through
:mod:`hsextract.contract.hook_config`) in images where torch is not importable yet."""

#: the storage name in meta.json, the ``/generate`` key and the configs
FP8_STORAGE = "float8_e4m3fn"
STORAGES = (FP8_STORAGE,)
