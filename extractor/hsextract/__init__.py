"""hsextract: extract a target model's hidden states for EAGLE-3 drafter training."""

__version__ = "0.1.0"

from hsextract.errors import (
    BadSampleError,
    ConfigError,
    DatasetError,
    DiskSpaceError,
    DumpError,
    HsextractError,
    OutputError,
    ServerError,
)

__all__ = [
    "BadSampleError",
    "ConfigError",
    "DatasetError",
    "DiskSpaceError",
    "DumpError",
    "HsextractError",
    "OutputError",
    "ServerError",
    "__version__",
]
