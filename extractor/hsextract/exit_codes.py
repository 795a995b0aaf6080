"""The exit codes of every command (README "Exit codes"): one table the CLI and the pipeline share."""

#: a fatal stop (or ``verify`` found problems)
EXIT_FATAL = 1
#: bad configuration, or this run does not match the output's identity
EXIT_CONFIG = 2
#: finished, but some rows failed: rerun to retry them
EXIT_INCOMPLETE = 3
#: interrupted: rerun to resume
EXIT_INTERRUPTED = 130
