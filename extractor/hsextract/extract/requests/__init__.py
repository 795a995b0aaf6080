"""The extractor's side of the HTTP exchange: ``client`` (``/generate``, ``/model_info``, ``/health``;
each answer classified as done, retryable or bad), ``http_threads`` (the pool of blocking HTTP threads,
cancellable), ``open_requests`` (the requests in flight and their deadlines), ``server_gate`` (a run that
waits for a server that stopped taking connections), ``generation_client`` (``/generate`` with decoding,
for ``regenerate``). Imports ``contract``, ``output`` and the run's ``config``, ``metrics`` and ``ledger``."""
