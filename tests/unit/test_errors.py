"""One exception tree: every public error derives from HsextractError and is drawn in the docstring."""

from __future__ import annotations

import inspect
import pickle

import hsextract
from hsextract import errors
from hsextract.contract.states import ErrorReason


def test_every_error_is_in_the_tree_and_its_drawing() -> None:
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) >= 10
    for cls in classes:
        assert issubclass(cls, errors.HsextractError), cls
        assert cls.__name__ in (errors.__doc__ or ""), f"{cls.__name__} is missing from the drawing in errors.py"
        assert cls.__name__ in hsextract.__all__, f"{cls.__name__} is not re-exported by hsextract"


def test_errors_with_a_reason_share_one_base() -> None:
    for cls in (errors.BadSampleError, errors.DumpError, errors.BadRequestError, errors.LayerMismatchError):
        assert issubclass(cls, errors.ReasonedError)
        assert cls(ErrorReason.NOT_JSON, "message").reason == "not_json"


def test_every_error_pickles_whole() -> None:
    """A pack process sends its row's error back pickled: the class, message, reason, fatal and retryable arrive as
    they left (Exception's own pickling passes only the message, which the reasoned errors' constructors refuse)."""
    made = [
        errors.DumpError(ErrorReason.TOKEN_MISMATCH, "ids differ"),
        errors.LayerMismatchError(ErrorReason.LAYER_MISMATCH, "layers differ"),
        errors.BadSampleError(ErrorReason.NOT_JSON, "not json"),
        errors.SpotCheckMismatchError("states differ"),
        errors.PackProcessError("the process ended"),
        errors.DiskFullError("full"),
    ]
    for error in made:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error)
        assert (back.fatal, back.retryable) == (error.fatal, error.retryable)
        assert getattr(back, "reason", None) == getattr(error, "reason", None)
