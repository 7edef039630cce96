"""The error every ``nri-numa`` subcommand raises for a problem the user can fix."""


class CliError(Exception):
    """A problem the user can fix; printed as one line, exit status 1."""
