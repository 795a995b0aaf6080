"""The end-of-run summary ``extract`` prints, and the pipeline's extract step with it."""

from __future__ import annotations

import sys

from hsextract.contract.states import RunStatus
from hsextract.exit_codes import EXIT_FATAL, EXIT_INCOMPLETE, EXIT_INTERRUPTED
from hsextract.extract.config import ExtractConfig
from hsextract.extract.outcome import RunSummary


def print_extract_summary(summary: RunSummary, config: ExtractConfig) -> int:
    """The end-of-run summary of ``extract`` (and of the pipeline's extract step) with its serving and train lines;
    the run's exit code."""
    if summary.data_config_not_written is None:
        details = f"details in {summary.output}/data_config.json and errors.jsonl"
    else:  # never point at a file that is not there (or is an earlier run's)
        details = (
            f"data_config.json could not be written in {summary.output} ({summary.data_config_not_written}): free space "
            "there if it is full, then rerun the same command, which writes it; details in errors.jsonl"
        )
    print(
        f"\n{summary.status.upper()}: {summary.output}\n"
        f"  rows in shard {summary.rows_in_shard}: written now {summary.written_now}, already done {summary.resumed}, "
        f"bad input {summary.bad_input}, failed {summary.failed}\n"
        f"  output holds {summary.total_samples} samples, {summary.total_tokens} tokens "
        f"({summary.truncated} truncated to max_seq_len {config.max_seq_len})\n"
        f"  took {summary.seconds:.1f} s; {details}\n"
        f"  dumps taken up at most {summary.longest_dump_pickup_s:.2f} s after they were complete; "
        f"{summary.late_answers} rows written before their HTTP answer came (hsextract_late_answers_total)"
    )
    if summary.server_outages:
        print(f"  waited through {summary.server_outages} server outage(s) mid-run (hsextract_server_outages_total)")
    for line in summary.hints:
        print(f"  {line}")
    if summary.status is RunStatus.STOPPED:
        # a fatal error's text, or why no row was usable (no error raised): data_config.json's stop_reason either way
        print(f"error: {summary.stop_reason or summary.fatal_error}", file=sys.stderr)
        return EXIT_FATAL
    if summary.status is RunStatus.INTERRUPTED:
        print(f"{summary.stop_reason}", file=sys.stderr)
        return EXIT_INTERRUPTED
    if summary.status is RunStatus.INCOMPLETE:
        print("some rows failed (see errors.jsonl, kind 'failed'); rerun the same command to retry them", file=sys.stderr)
        return EXIT_INCOMPLETE
    return 0
