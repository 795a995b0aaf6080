"""The server side: the dump sink and pinned buffers shared by ``sglang/`` (the forward hook and the
launcher) and ``embedded/`` (the transformers engine and its HTTP server). Never imports ``extract``.

Kept import-light: SGLang imports the hook inside its own process, so nothing here pulls in
transformers or the extractor."""
