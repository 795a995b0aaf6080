"""Operations helpers: status of the extraction hosts over SSH."""
