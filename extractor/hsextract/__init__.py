"""hsextract: extract a target model's hidden states for EAGLE-3 drafter training.

Read ``contract/`` first (what the server side and the extractor agree on), then ``extract/``
(the extractor) and ``capture/`` (the SGLang hook and the embedded server); docs/design-notes.md
has the module map.
"""

__version__ = "0.1.0"

from hsextract.errors import (
    BadRequestError,
    BadSampleError,
    ConfigError,
    DatasetError,
    DiskFullError,
    DiskSpaceError,
    DumpError,
    GatherError,
    HsextractError,
    IdentityMismatchError,
    LayerMismatchError,
    MergeError,
    ModelMismatchError,
    OutputError,
    OutputLockedError,
    PackProcessError,
    ReasonedError,
    RidInUseError,
    ServerError,
    ServerUnreachableError,
    SpotCheckMismatchError,
    SpotCheckUnavailableError,
    StorageMismatchError,
    TransientServerError,
    UnsafeDumpDirError,
    WrongServerError,
)

__all__ = [
    "BadRequestError",
    "BadSampleError",
    "ConfigError",
    "DatasetError",
    "DiskFullError",
    "DiskSpaceError",
    "DumpError",
    "GatherError",
    "HsextractError",
    "IdentityMismatchError",
    "LayerMismatchError",
    "MergeError",
    "ModelMismatchError",
    "OutputError",
    "OutputLockedError",
    "PackProcessError",
    "ReasonedError",
    "RidInUseError",
    "ServerError",
    "ServerUnreachableError",
    "SpotCheckMismatchError",
    "SpotCheckUnavailableError",
    "StorageMismatchError",
    "TransientServerError",
    "UnsafeDumpDirError",
    "WrongServerError",
    "__version__",
]
