"""Errors users see. Exit codes (documented in the README and `otbuild --help`):
0 ok, 1 findings or a failed build, 2 usage or config error."""

EXIT_OK, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


class ConfigError(Exception):
    """A recipe or command-line problem: printed as is, exit code 2, nothing written."""

    exit_code = EXIT_USAGE


class StageError(Exception):
    """A stage that cannot make a valid artifact (e.g. a source with no usable item): printed
    as is in the job's log, exit code 1, no provenance record."""

    exit_code = EXIT_FINDINGS
