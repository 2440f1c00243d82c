"""The FSDP2 strategy of ``trainer=fsdp``: Lightning's ``ModelParallelStrategy`` with every rank data-parallel.

``ModelParallelStrategy`` needs the data-parallel size up front, which a config cannot compute from
``devices × num_nodes``; this subclass fills it in from the world size once the processes exist. The
module shards itself in :meth:`lit_entropy.module.PolicyModule.configure_model` (``fully_shard`` per
decoder layer). Runs on CUDA with NCCL and on CPU with gloo.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy


class FSDP2Strategy(ModelParallelStrategy):
    def __init__(self, save_distributed_checkpoint: bool = False, **kwargs: Any) -> None:
        """``save_distributed_checkpoint=False`` (default) writes one full ``.ckpt`` file from rank 0, which
        loads on any number of ranks; ``True`` writes a sharded checkpoint directory (faster for big models)."""
        kwargs.setdefault("data_parallel_size", 1)
        kwargs.setdefault("tensor_parallel_size", 1)
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint, **kwargs)

    def setup_environment(self) -> None:
        # Every process is one data-parallel rank (no tensor parallelism): W = devices × num_nodes.
        self._data_parallel_size = self.num_processes * self.num_nodes
        self._tensor_parallel_size = 1
        super().setup_environment()
