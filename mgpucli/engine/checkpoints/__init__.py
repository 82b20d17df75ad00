"""A run's checkpoints, one module for each thing they hold:

- :mod:`.files`: the checkpoint file itself, the one place that writes and reads one (atomic writes, reads with
  ``weights_only=True``, the format version);
- :mod:`.state`: the training state that goes in and comes out (model and optimizer state dicts through
  ``torch.distributed.checkpoint.state_dict``, RNG states, the resume checks);
- :mod:`.sharded`: the sharded format (FSDP, a ``torch.distributed.checkpoint`` directory per step);
- :mod:`.training`: a training run's saves and restores (the run dir taken, every rank joining, rank 0 writing).

``mgpu validate`` evaluates one (:mod:`mgpucli.engine.validate_checkpoint`); ``mgpu doctor RUN_DIR`` reads a
checkpoint's step without torch (:mod:`mgpucli.postmortem.checkpoint_peek`).
"""
