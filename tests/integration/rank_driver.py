"""One RL iteration per named config on however many ranks this process group has; dumps what it saw.

Run on one process (``python tests/integration/rank_driver.py OUT trainer=cpu NAME=override,...``) or
under ``torchrun --nproc_per_node=2`` with ``trainer=ddp`` / ``trainer=fsdp``, given once or per config (one
process group serves fits of both strategies, one after the other). For every config it
composes the real Hydra config, fits one iteration with the real Trainer, and writes
``OUT/<name>.rank<r>.pt``: the full parameters after the update, the batch's completions, rewards,
``rollout/entropy``, old log-probs and the controllers' state. One engine per process and model serves
every config of that model (it is started once, after the process group exists); configs may name
different ``model.name_or_path``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402
from hydra.utils import instantiate  # noqa: E402

from lit_entropy.train import build  # noqa: E402
from lit_entropy.utils import dist  # noqa: E402
from tests.helpers import compose_train  # noqa: E402


def full_params(module) -> dict[str, torch.Tensor]:
    return {k: v.clone() for k, v in dist.full_state_items(module.model)}


def main(out: Path, common: list[str], configs: dict[str, list[str]]) -> None:
    engines: dict[str, object] = {}

    def shared_engine(factory, key: str):
        def make(**kw):
            if key not in engines:
                engines[key] = factory(**kw)
            return engines[key]
        return make

    for name, extra in configs.items():
        cfg = compose_train(common + extra + [f"paths.output_dir={out / name}"])
        trainer, module, datamodule = build(cfg, engine=shared_engine(instantiate(cfg.rollout.engine),
                                                                       str(cfg.model.get("name_or_path"))))
        trainer.fit(module, datamodule=datamodule)
        datamodule.teardown("fit")
        batch = trainer.train_dataloader.dataset.rollout  # the last iteration's
        state = {type(cb).__name__: cb.state_dict() for cb in trainer.callbacks if cb.state_dict()}
        record = {
            "params": full_params(module),
            "completions": batch.completions,
            "rewards": batch.rewards,
            "old_logp": batch.old_logp,
            "entropy": batch.metrics["rollout/entropy"],
            "mismatch_max": batch.metrics["diag/logp_mismatch_max"],
            "controllers": state,
            "world_size": dist.world_size(),
        }
        dump = out / f"{name}.rank{dist.rank()}.pt"  # a name may hold a folder: ``ddp/token_mean``
        dump.parent.mkdir(parents=True, exist_ok=True)
        torch.save(record, dump)
    for engine in engines.values():
        engine.close()


if __name__ == "__main__":
    out_dir, *args = sys.argv[1:]
    common = [a for a in args if "=" in a and ":" not in a.split("=")[0]]
    configs: dict[str, list[str]] = {}
    for a in args:
        if ":" in a.split("=")[0]:  # NAME:override1,override2
            name, _, rest = a.partition(":")
            configs[name] = [o for o in rest.split(";") if o]
    main(Path(out_dir), common, configs or {"default": []})
