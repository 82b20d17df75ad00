"""The command line: typer + rich. Parse, call one function, render, map errors to exit codes."""
