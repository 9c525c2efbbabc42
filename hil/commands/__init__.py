"""CLI subcommands: each module here defines `command`, a click.Command, found at start-up."""
