import os
import time

from mgpucli.components.datasets import SyntheticClassification


class SlowOnRank(SyntheticClassification):
    """The quickstart's data, with rank 1's items 20 ms slower each."""

    def __getitem__(self, i):
        if os.environ.get("RANK") == "1":
            time.sleep(0.02)
        return super().__getitem__(i)
