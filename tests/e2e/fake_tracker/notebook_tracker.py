"""The fake tracker's client library: what trainer.loggers: [notebook] needs installed."""
