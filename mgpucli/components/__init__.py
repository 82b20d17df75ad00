"""mgpu's own components (datasets, models, tasks) for the shipped recipes, usable as ``_target_``s."""
