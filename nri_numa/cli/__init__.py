"""``nri-numa``: the command line, a front door for people. One module per subcommand, each
with its parser (``add_parser``) and handler (``cmd_<name>``); ``main`` builds the parser from
them. Handlers import the library they use inside the function, so each command loads only what
it needs (a hook run with a daemon loads nothing but ``nri_numa.hook.client``)."""

from nri_numa.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
