"""CLI subcommands: each module parses its flags and calls library functions."""
