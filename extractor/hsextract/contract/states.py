"""The states the files record, named once: a dump directory's state, a run's status in
``data_config.json``, and the kind of a row in ``errors.jsonl``. Values are the strings on disk."""

from __future__ import annotations

from enum import Enum


class _StrEnum(str, Enum):
    """Prints and formats as its value (as ``enum.StrEnum`` does from Python 3.11)."""

    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)


class DumpState(_StrEnum):
    """A dump directory: ``done`` (complete), ``error`` (the writer failed) or still ``pending``."""

    DONE = "done"
    ERROR = "error"
    PENDING = "pending"


class RunStatus(_StrEnum):
    """How an extraction run ended (``data_config.json`` ``status``)."""

    COMPLETE = "complete"  # every row written or recorded as bad input
    INCOMPLETE = "incomplete"  # finished, but some rows failed: a rerun retries them
    INTERRUPTED = "interrupted"  # Ctrl-C or SIGTERM: a rerun resumes
    STOPPED = "stopped"  # a fatal stop: fix the cause, then rerun


class ErrorKind(_StrEnum):
    """Why a row is in ``errors.jsonl``."""

    BAD_INPUT = "bad_input"  # the row itself is unusable: skipped for good
    FAILED = "failed"  # it kept failing this run: retried by the next run


class ErrorReason(_StrEnum):
    """The ``reason`` of a row in ``errors.jsonl`` and the label of ``hsextract_errors_total``.

    Every reason the extractor can record is here, so the metric has a series (0) for each
    from the start."""

    # the dataset row itself (bad input, final)
    EMPTY_LINE = "empty_line"
    NOT_JSON = "not_json"
    NOT_OBJECT = "not_object"
    MISSING_INPUT_IDS = "missing_input_ids"
    INPUT_IDS_NOT_LIST = "input_ids_not_list"
    INPUT_IDS_NOT_INTEGER = "input_ids_not_integer"
    EMPTY_INPUT_IDS = "empty_input_ids"
    NEGATIVE_INPUT_IDS = "negative_input_ids"
    INPUT_IDS_OUT_OF_VOCAB = "input_ids_out_of_vocab"
    LOSS_MASK_NOT_LIST = "loss_mask_not_list"
    LOSS_MASK_NOT_INTEGER = "loss_mask_not_integer"
    LOSS_MASK_LENGTH = "loss_mask_length"
    LOSS_MASK_NOT_BINARY = "loss_mask_not_binary"
    MISSING_LOSS_MASK = "missing_loss_mask"  # only with --require-loss-mask
    ROW_OUT_OF_RANGE = "row_out_of_range"
    EMPTY = "empty"
    SERVER_REJECTED = "server_rejected"  # the server's HTTP 400 for this prompt
    LONGER_THAN_CONTEXT = "longer_than_context"  # after the cut to max_seq_len, still too long for the served model
    # the request or its dump (retried, then failed)
    SERVER = "server"
    BAD_RID = "bad_rid"
    DUMP_INCOMPLETE = "dump_incomplete"
    DUMP_MALFORMED = "dump_malformed"
    DUMP_UNREADABLE = "dump_unreadable"
    UNSAFE_DUMP = "unsafe_dump"
    SERVER_DUMP_ERROR = "server_dump_error"
    DUMP_TIMEOUT = "dump_timeout"
    TOKEN_MISMATCH = "token_mismatch"
    SHAPE_MISMATCH = "shape_mismatch"
    MISSING_FINAL_PRENORM = "missing_final_prenorm"
    MISSING_FINAL_POSTNORM = "missing_final_postnorm"
    DTYPE_MISMATCH = "dtype_mismatch"
    NON_FINITE = "non_finite"
    PACK_PROCESS_ENDED = "pack_process_ended"  # the process packing the row died (killed, out of memory)
    SPOT_CHECK_MISMATCH = "spot_check_mismatch"  # the engine's own states of the row differ from its dump
    # the whole run stops on these
    LAYER_MISMATCH = "layer_mismatch"
    MODEL_MISMATCH = "model_mismatch"
    # never recorded: the run was stopping while this request waited
    INTERRUPTED = "interrupted"
