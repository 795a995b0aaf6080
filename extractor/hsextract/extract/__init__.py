"""The extractor: dataset -> client -> dump checks -> formats -> manifest -> data_config -> verify,
with metrics and progress. The run itself is ``run.Extraction``. Never imports ``capture``."""
