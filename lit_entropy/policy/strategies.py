"""The FSDP2 strategy of ``trainer=fsdp``: Lightning's ``ModelParallelStrategy`` with every rank data-parallel.

``ModelParallelStrategy`` needs the data-parallel size up front, which a config cannot compute from
``devices × num_nodes``; this subclass fills it in from the world size once the processes exist. The
module shards itself in :meth:`lit_entropy.module.PolicyModule.configure_model` (``fully_shard`` per
decoder layer) with a mixed-precision policy that follows ``trainer.precision``. Runs on CUDA with NCCL and on
CPU with gloo.
"""

from __future__ import annotations

from typing import Any

import torch
from lightning.pytorch.strategies import ModelParallelStrategy

from lit_entropy.policy.lora import is_peft
from lit_entropy.policy.precision import engine_dtype_for


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


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The repeated blocks of a causal LM: FSDP2's unit of sharding.

    The modules of the class a ``transformers`` model declares unsplittable (``_no_split_modules``: its
    decoder layer, e.g. ``LlamaDecoderLayer``, ``GPT2Block``, ``GPTNeoXLayer``); otherwise the largest
    ``ModuleList`` (which, in a Mixture-of-Experts model that keeps its experts in one, can be the experts).
    """
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    declared = set(getattr(base, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in declared]
    if layers:
        return layers
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def mixed_precision_policy(precision: str | None) -> Any:
    """FSDP2's ``MixedPrecisionPolicy`` for ``trainer.precision``.

    Under ``bf16-mixed`` and ``16-mixed`` (``precision=bf16``, ``precision=fp16``) the all-gathered parameters,
    hence the forward and backward, are in the autocast dtype, while the sharded parameters the optimizer steps
    stay fp32 and gradients are reduced in fp32 (a sum over ranks in 16 bits loses what the fp32 master weights
    keep). Log-probs, entropy and losses are cast to fp32 by the loss functions as in every mode. Other
    precisions (``32-true``; ``*-true`` weights already in their dtype) need no policy: ``None``.
    fp16's loss scaler works on the sharded gradients as on plain ones: a DTensor's non-finite check reduces
    ``found_inf`` over the mesh, so every rank skips the same steps.
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if not str(precision).endswith("-mixed"):
        return None
    return MixedPrecisionPolicy(param_dtype=getattr(torch, engine_dtype_for(precision)), reduce_dtype=torch.float32)


def fully_shard_policy(model: torch.nn.Module, mesh: Any, precision: str | None = None) -> None:
    """``fully_shard`` each decoder layer of ``model``, then the whole model, over the data-parallel mesh, with
    :func:`mixed_precision_policy` of ``precision`` (``trainer.precision``)."""
    from torch.distributed.fsdp import fully_shard

    if is_peft(model):
        raise ValueError("model.lora with trainer=fsdp is not supported yet: use trainer=ddp, or full fine-tuning")
    dp_mesh = mesh["data_parallel"] if "data_parallel" in (mesh.mesh_dim_names or ()) else mesh
    if mesh.mesh_dim_names and "tensor_parallel" in mesh.mesh_dim_names and mesh["tensor_parallel"].size() > 1:
        raise ValueError("trainer=fsdp shards data-parallel only: set tensor_parallel_size=1")
    policy = mixed_precision_policy(precision)
    kwargs = {"mp_policy": policy} if policy is not None else {}
    for layer in decoder_layers(model):
        fully_shard(layer, mesh=dp_mesh, **kwargs)
    fully_shard(model, mesh=dp_mesh, **kwargs)
