"""mgpu's benchmarks (not tests): overhead against a hand-written DDP loop, DP vs DDP on GPUs, CLI start-up."""
