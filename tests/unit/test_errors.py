"""One exception tree: every public error derives from HsextractError and is drawn in the docstring."""

from __future__ import annotations

import inspect

import hsextract
from hsextract import errors


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
        assert cls("some_reason", "message").reason == "some_reason"
