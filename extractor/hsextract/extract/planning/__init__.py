"""What a run has to do: the dataset read and validated row by row (``dataset``, ``dataset_shape``,
``context_fit``, ``served_tokenizer``), its size estimated then counted (``plan``, ``scan``), the rows an
earlier run wrote checked before they are skipped (``resume_check``), the order rows are sent in
(``ordering``). Imports ``contract``, ``durable``, ``output``; nothing else of ``extract``."""
