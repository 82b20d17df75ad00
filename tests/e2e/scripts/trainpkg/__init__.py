"""A package whose module is launched with ``mgpu launch -m trainpkg.train``."""
