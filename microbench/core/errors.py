"""The library raises these; only the CLI turns them into exit codes and one stderr line."""

from .redaction import redact_text


class MicrobenchError(Exception):
    """Base of every error microbench raises on purpose. exit_code is what the CLI returns."""

    exit_code = 1

    def __str__(self) -> str:
        # The one place an error becomes text: a URL password quoted by any layer below
        # (ours, botocore's, s3fs's) is hidden here, whatever message carried it.
        return redact_text(super().__str__())


class UsageError(MicrobenchError):
    """The user asked for something malformed or impossible (exit 2)."""

    exit_code = 2


class RunError(MicrobenchError):
    """A well-formed run failed: a peer died, a timeout, a wrong result, I/O failure (exit 1)."""

    exit_code = 1


class Inconclusive(MicrobenchError):
    """A run finished, but its measurements cannot tell pass from fail: noise alone (the readings'
    spread, other work on the machine) could move a result across its tolerance (exit 3). The
    message says what was unsure and how to get a clean verdict."""

    exit_code = 3


class ProbeUnavailable(MicrobenchError):
    """The probe cannot run on this machine (no GPU, no fio, no root); the message says why.

    Not a failure of the thing measured, so the CLI reports it as a skip (exit 0) while a
    suite or acceptance run records it as skipped with the reason.
    """

    exit_code = 0


class Interrupted(RunError):
    """Ctrl-C or SIGTERM during a run; what finished is kept in a partial record."""


class OutputClosed(BaseException):
    """stdout's reader went away (`microbench ... | head -1`). Not a failure of the run: the
    command ends quietly with the SIGPIPE convention's status (cli.py), what it measured kept in
    a partial record. A BaseException, like KeyboardInterrupt, so that no layer that carries on
    after an error (a suite's next step, a probe's next case) mistakes it for one."""

    exit_code = 128 + 13
    reason = "stdout closed by its reader"
