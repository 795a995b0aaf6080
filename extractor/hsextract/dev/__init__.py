"""Development helpers: the random-weight tiny model and the sample dataset of the embedded default."""
