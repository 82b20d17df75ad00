"""The training engine (torch). Knows nothing of typer or rich: it reports through a Reporter interface."""
