"""What an output directory is, and the commands that read a finished one.

The directory:

- ``formats/``: the sample files each trainer reads (the registry, SpecForge's, speculators'), written
  from a ``sample.Sample``;
- ``manifest``: ``samples.jsonl`` and ``errors.jsonl``, one line a row;
- ``checksum``: each sample file's xxh3-128, taken while it is written;
- ``identity``: ``identity.json``, what the output was made from, checked before a resume adds to it;
- ``data_config``: ``data_config.json``, the run's record for trainers and for ``merge``;
- ``serving_hints``: how SGLang must serve a drafter trained on it (``--speculative-eagle-...``);
- ``merge_plan``: how the shards of one dataset fit together.

The commands on a finished output: ``verify`` (re-reads every file), ``merge`` (shards into one), and
``drafter`` (``draft-config`` and ``check-draft``: a drafter's config against the layers it was trained on).

Imports ``contract``, ``durable`` and ``errors`` only: the extraction run (``extract``) writes through it,
``pipeline`` and ``ops`` read it.
"""
