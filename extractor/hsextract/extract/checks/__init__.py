"""Whether a dump holds what the run asked for, before its row counts: ``dump_checks`` (tokens, shapes,
dtype, layers, finiteness, FP8 scales), ``spot_check`` and ``spot_compare`` (every Nth row against the
engine's own hidden states, judged against the alternatives a wrong dump path would hold),
``stale_dumps`` (dumps a killed run left). Imports ``contract``, ``output``, ``extract.requests`` (the spot
check's request) and the run's ``config`` and ``metrics``."""
