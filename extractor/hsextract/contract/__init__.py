"""What the server side and the extractor agree on: request ids, layer numbering, the dump files,
atomic writes, the model's config reader and the ``/server_info`` shape. Read this first."""
