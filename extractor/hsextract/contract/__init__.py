"""What the server side and the extractor agree on: request ids (``rids``), layer numbering (``layers``,
``sglang_capture``), the ``/generate`` and spot-check shapes (``generate``, ``spot_check``), the model's
config reader and fingerprint, the hook's settings, the ``/server_info`` shape, the defaults both sides
use, and under ``files/`` the bytes of a dump and a stored sample. Read this first.

Imports ``durable`` and the small shared modules (``errors``, ``paths``); every other part imports it."""
