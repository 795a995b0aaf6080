"""The extraction run (``hsextract extract``): a dataset's rows through the server into an output.

A row's way, one folder per step, then the writing:

1. ``planning/``: the dataset read and validated, how much there is to do, which rows an earlier run
   already wrote (resume), the order they are sent in;
2. ``requests/``: the ``/generate`` requests to the server, on a pool of HTTP threads, and the wait for
   a server that went away;
3. ``checks/``: the checks of each dump before it counts (tokens, shapes, layers, finiteness), the spot
   check against the engine's own states, stale dumps swept;
4. ``row_worker``: one row's request, dump, checks and retries, the row packed into its output format
   (``packing``, with ``hsextract.output.formats``; in a pack process with room when the run has them:
   ``pack_processes``, whose other side is ``pack_worker``) and recorded by the ``ledger`` (samples.jsonl,
   errors.jsonl, the counts, the run's stop).

Here too: ``config`` (the options), ``preflight`` and ``setup`` (everything checked before the first
request), ``run`` (``Extraction``: the loop over the rows), ``outcome`` and ``report`` (the summary,
``data_config.json``, the exit code), ``metrics`` and ``progress``. The folders import these (the
options, the metrics, the ledger), never one another's modules but as the steps run: ``checks`` ->
``requests`` -> ``planning``.

May import ``contract``, ``durable``, ``output`` and ``errors``; never ``capture`` (the two sides meet
only in ``contract``: ``ruff.toml`` bans it).
"""
