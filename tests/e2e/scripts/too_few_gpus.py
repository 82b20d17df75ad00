"""pytorch/examples' DDP scripts on a machine with fewer GPUs than they want: they say so and exit 0."""

import sys

import torch

if __name__ == "__main__":
    n_gpus = torch.cuda.device_count()
    if n_gpus < 2:
        print(f"Unable to locate sufficient {2} gpus to run this example. Exiting.")
        sys.exit()
    print("training on", n_gpus, "gpus")
