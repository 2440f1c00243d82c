"""RolloutDataModule: the data of every iteration: prompts, sampling and scoring, minibatches (docs/design.md §3).

``train_dataloader()`` is called once per epoch (``reload_dataloaders_every_n_epochs=1``) and runs one RL iteration
up to the update, :func:`lit_entropy.iteration.run`, which reads as the algorithm; this module holds the steps
that are the data's: drawing prompts, sampling and scoring G completions per prompt through the
:class:`~lit_entropy.rollout.sampler.Sampler` (also ahead of time, with ``rollout.max_staleness``), and cutting
the kept rows into minibatches.

On W ranks (``trainer=ddp`` / ``trainer=fsdp``) each rank samples and scores a contiguous block of whole
groups, seeded by global prompt index, and the groups are all-gathered in rank order: every rank then
holds exactly the batch one rank would have built, so advantages, the pre-update pass, ``rollout/entropy``
and every controller's decision are identical on all ranks. The minibatch list is the same on every rank
too; the module deals each minibatch's micro-batches out to the ranks.
"""

from __future__ import annotations

import logging
import random
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, NamedTuple

import lightning.pytorch as pl
import torch
from lightning.pytorch.trainer.states import TrainerStatus
from torch.utils.data import DataLoader

from lit_entropy import advantages as adv
from lit_entropy.checkpointing import preserved_rng
from lit_entropy.iteration import TrainablePolicy, UpdateData, call_rollout_hooks
from lit_entropy.iteration import run as iteration_run
from lit_entropy.policy.models import PolicyBundle
from lit_entropy.rollout.base import Generation
from lit_entropy.rollout.batch import BatchConfig, RolloutBatch
from lit_entropy.rollout.overlap import Producer
from lit_entropy.rollout.sampler import Sampler
from lit_entropy.tasks.prompts import Prompt, PromptSource
from lit_entropy.utils import dist

log = logging.getLogger(__name__)


class Group(NamedTuple):
    """One prompt and its G sampled, scored completions (all ranks' groups, after the gather)."""

    prompt: Prompt
    prompt_ids: list[int]
    generations: list[Generation]
    rewards: list[float]
    texts: list[str]


class RolloutDataModule(pl.LightningDataModule):
    def __init__(
        self,
        prompts: PromptSource,
        sampler: Sampler | None = None,
        batch: BatchConfig | None = None,
        seed: int = 0,
        chat_template: bool = False,
        system_prompt: str | None = None,
    ) -> None:
        """``chat_template``: wrap each prompt as the user's turn with the tokenizer's chat template
        (instruct models; ``system_prompt`` adds a system turn); false feeds the prompt text as it is (base
        models, e.g. an R1-Zero-style ``prompts.template``)."""
        super().__init__()
        self.prompts = prompts
        self.sampler = sampler
        self.batch = batch or BatchConfig()
        self.seed = seed
        self.chat_template = chat_template
        self.system_prompt = system_prompt
        s = sampler.sampling if sampler is not None else None
        self._finish: Any = None
        self._warm = False
        self.context: int | None = None  # the policy's context in tokens, known once it starts
        self.producer = (Producer(s.max_staleness, s.staleness_policy, engine_cores=s.engine_cores)
                         if s is not None and s.max_staleness > 0 else None)
        if self.producer is not None:
            sampler.producer = self.producer

    # ---- one iteration ---------------------------------------------------------------------------
    def train_dataloader(self) -> DataLoader:
        """One RL iteration up to the update (:func:`lit_entropy.iteration.run`), its minibatches as the loader."""
        trainer = self.trainer
        return iteration_run(self, trainer, trainer.lightning_module, trainer.current_epoch)

    def overlapped_batch(self, trainer: pl.Trainer, policy: TrainablePolicy, iteration: int
                         ) -> tuple[RolloutBatch, dict[str, float], int]:
        """Steps 0-2 of the iteration with ``rollout.max_staleness = k >= 1`` (:mod:`lit_entropy.rollout.overlap`):
        batch ``iteration`` was sampled by weight version ``max(0, iteration - k)``, mostly during the previous
        update, and batch ``iteration + k`` is launched from the current weights before this update. Returns the
        batch, its metrics and how many of its rows are over the staleness bound (policy ``drop``)."""
        producer, tok = self.producer, policy.tokenizer

        def finish(j: int, pre: tuple) -> tuple[RolloutBatch, dict[str, float]]:
            metrics = {"time/generate": 0.0, "time/score": 0.0}
            return self.sample_batch(tok, j, metrics, first=pre), metrics

        self._finish = finish

        waited = producer.drain(finish)  # batches in flight land in the boundary's checkpoint
        call_rollout_hooks(trainer, "on_rollout_start")
        self.start(policy)
        t0 = time.perf_counter()
        self.sampler.sync(policy.model, iteration)  # version `iteration`; no generation is in flight
        t_sync = time.perf_counter() - t0
        for j in producer.wanted(iteration):
            producer.launch(j, iteration, self.generation_job(tok, j))  # past max_epochs too: a longer resume
        # The first iteration of a process (the start, a resume) waits for every batch it launched: the uninterrupted
        # run's first background generation ran beside no update (iteration 0 fills the pipeline), and a resumed
        # process whose first one did changed the update's last bits in the SIGKILL resume test.
        waited += producer.drain(finish, upto=None if not self._warm else iteration)
        self._warm = True
        taken = producer.take(iteration)
        if taken is None:  # policy `wait` on a batch over the bound: sampled again from the current weights
            producer.launch(iteration, iteration, self.generation_job(tok, iteration))
            waited += producer.drain(finish, upto=iteration)
            taken = producer.take(iteration)
        batch, metrics, dropped = taken
        metrics.update({"time/sync": t_sync, "time/wait_rollout": waited, "rollout/stale_dropped_rows": float(dropped)})
        return batch, metrics, dropped

    def generation_job(self, tok: Any, iteration: int) -> Any:
        """The engine's part of batch ``iteration``'s first sampling round (this rank's prompts, sampled and scored),
        as a function for the producer's thread; prompts and seeds are drawn here, as the synchronous path does."""
        prompts, prompt_ids, first, last, seed = self._round_inputs(tok, iteration, 0)
        G = self.batch.group_size
        return lambda: (prompts, prompt_ids, self.sampler.sample(prompts[first:last], prompt_ids[first:last], G, seed,
                                                                 first_index=first))

    def state_dict(self) -> dict[str, Any]:
        """With ``rollout.max_staleness`` >= 1: the batches sampled ahead (empty, so not saved, otherwise). The end
        of training's checkpoint waits for the batch in flight (a longer resume trains on it); an exception's
        checkpoint leaves it out."""
        trainer = self.trainer
        if (self.producer is not None and self.producer.inflight and self._finish is not None and trainer is not None
                and trainer.state.status == TrainerStatus.RUNNING):
            self.producer.drain(self._finish)
        return {"overlap": self.producer.state_dict()} if self.producer is not None else {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if self.producer is not None and "overlap" in state_dict:
            self.producer.load_state_dict(state_dict["overlap"])

    def minibatch_loader(self, batch: RolloutBatch, iteration: int) -> DataLoader:
        """The kept rows, shuffled into ``num_minibatches`` minibatches, ``ppo_epochs`` times."""
        gen = torch.Generator().manual_seed(self.seed * 7919 + iteration)
        minibatches = []
        for _ in range(self.batch.ppo_epochs):
            minibatches.extend(batch.minibatches(self.batch.num_minibatches, generator=gen))
        if not minibatches:
            log.warning("iteration %d: every row was rejected; no update this iteration", iteration)
            minibatches = [batch.select(torch.arange(0))]  # one empty step keeps Lightning's epoch going
        # generator=: each iterator draws a seed, and Lightning makes more iterators in a fresh process's later
        # epochs than in a resumed one's first; from the global RNG that would break exact resume.
        return DataLoader(UpdateData(batch, minibatches), batch_size=None, shuffle=False, collate_fn=lambda x: x,
                          generator=gen)

    def sample_batch(self, tok: Any, iteration: int, metrics: dict[str, float], first: tuple | None = None
                     ) -> RolloutBatch:
        """Draw prompts, sample G completions each, score them: one right-padded batch.

        With ``batch.dynamic_sampling`` (DAPO) groups whose rewards are all equal are dropped and more
        prompts are drawn, up to ``batch.max_sampling_rounds`` extra rounds, until the batch is full.
        ``first``: the first round's prompts, ids and this rank's scored samples, already generated
        (:meth:`generation_job`).
        """
        cfg, G = self.batch, self.batch.group_size
        rounds = 1 + (cfg.max_sampling_rounds if cfg.dynamic_sampling else 0)
        kept: list[Group] = []
        errors = 0
        for rnd in range(rounds):
            groups, round_metrics, round_errors = self._sample_round(tok, iteration, rnd, metrics,
                                                                     first if rnd == 0 else None)
            errors += round_errors
            if rnd == 0:
                first_round_metrics, first_groups = round_metrics, groups
            if cfg.dynamic_sampling:  # float64: the rewards compare exactly as the Python floats they are
                rewards = torch.tensor([r for g in groups for r in g.rewards], dtype=torch.float64)
                chosen = adv.select_groups(cfg.prompts_per_iter - len(kept), adv.group_has_signal(rewards, G))
                groups = [groups[i] for i in chosen.tolist()]
            kept.extend(groups[: cfg.prompts_per_iter - len(kept)])
            if len(kept) >= cfg.prompts_per_iter:
                break
        signal_groups = len(kept)
        if not kept:  # nothing to learn from: keep the first round (zero advantages, a no-op update)
            log.warning("iteration %d: every group had equal rewards in %d rounds", iteration, rounds)
            kept = first_groups
        batch = build_batch([g.prompt_ids for g in kept], [g.generations for g in kept],
                            [r for g in kept for r in g.rewards], G, pad_id=tok.pad_id)
        batch.prompts = [g.prompt.text for g in kept for _ in range(G)]
        batch.completions = [t for g in kept for t in g.texts]
        metrics.update(first_round_metrics)  # rollout/* describe what the policy generated
        metrics["rollout/reward_errors"] = float(errors)
        if cfg.dynamic_sampling:
            metrics["rollout/sampling_rounds"] = float(rnd + 1)
            metrics["rollout/kept_groups_frac"] = signal_groups / cfg.prompts_per_iter
        return batch

    def _round_inputs(self, tok: Any, iteration: int, rnd: int) -> tuple[list, list[list[int]], int, int, int]:
        """A round's prompts, their ids, this rank's block ``[first, last)`` and the sampling seed."""
        prompts = self.prompts.sample(self.batch.prompts_per_iter, iteration, rnd)
        prompt_ids = [self.encode_prompt(tok, p.text) for p in prompts]
        check_context(prompts, prompt_ids, self.context, self.sampler.sampling.max_new_tokens, iteration)
        first, last = dist.shard_bounds(len(prompts))
        seed = random.Random(f"{self.seed}:gen:{iteration}:{rnd}").randrange(2**30)
        return prompts, prompt_ids, first, last, seed

    def _sample_round(self, tok: Any, iteration: int, rnd: int, metrics: dict, pre: tuple | None = None
                      ) -> tuple[list[Group], dict, int]:
        """Draw, sample and score one round of prompts: this rank's block, then all-gathered (``pre``: the
        prompts, ids and this rank's samples, generated already)."""
        G = self.batch.group_size
        if pre is None:
            prompts, prompt_ids, first, last, seed = self._round_inputs(tok, iteration, rnd)
            mine = self.sampler.sample(prompts[first:last], prompt_ids[first:last], G, seed, first_index=first)
        else:
            prompts, prompt_ids, mine = pre
        gens, scores, texts, errors = self._gather(mine, metrics)
        batch = build_batch(prompt_ids, gens, scores, G, pad_id=tok.pad_id)
        round_metrics = rollout_metrics(batch, [g for per in gens for g in per], texts,
                                        self.sampler.reward.correct_threshold)
        groups = [Group(p, ids, g, scores[i * G : (i + 1) * G], texts[i * G : (i + 1) * G])
                  for i, (p, ids, g) in enumerate(zip(prompts, prompt_ids, gens, strict=True))]
        return groups, round_metrics, errors

    @staticmethod
    def _gather(mine: Any, metrics: dict) -> tuple[list[list[Generation]], list[float], list[str], int]:
        """Every rank's scored samples in rank order (generations per prompt, rewards, texts, reward errors)."""
        metrics["time/generate"] = metrics.get("time/generate", 0.0) + mine.time_generate
        t0 = time.perf_counter()
        parts = dist.gather_objects((mine.generations, mine.rewards, mine.texts, mine.errors))  # rank order
        gens = [per_prompt for p in parts for per_prompt in p[0]]
        scores = [s for p in parts for s in p[1]]
        texts = [t for p in parts for t in p[2]]
        metrics["time/score"] = metrics.get("time/score", 0.0) + mine.time_score + time.perf_counter() - t0
        return gens, scores, texts, sum(p[3] for p in parts)

    def sample_extra(self, tok: Any, iteration: int, temperature: float, n: int, label: str,
                     metrics: dict[str, float]) -> RolloutBatch:
        """G more completions for each of the first ``n`` prompts of this iteration's first round, sampled at
        ``temperature`` from the engine's current weights and scored (AEPO's temperature-adjusted draw, whose
        callback decides ``n``; not yet through the pre-update pass). ``label`` names its own sampling seed, so the
        iteration's batch is unchanged by it; its times go to ``metrics`` (``time/generate``, ``time/score``)."""
        prompts, prompt_ids, _, _, _ = self._round_inputs(tok, iteration, 0)
        if not 1 <= n <= len(prompts):
            raise ValueError(f"sample_extra: n={n} prompts, but the round has {len(prompts)}")
        prompts, prompt_ids = prompts[:n], prompt_ids[:n]
        first, last = dist.shard_bounds(n)
        seed = random.Random(f"{self.seed}:{label}:{iteration}").randrange(2**30)
        G = self.batch.group_size
        sampler = self.sampler.with_sampling(temperature=temperature)
        mine = sampler.sample(prompts[first:last], prompt_ids[first:last], G, seed, first_index=first)
        gens, scores, texts, errors = self._gather(mine, metrics)
        batch = build_batch(prompt_ids, gens, scores, G, pad_id=tok.pad_id)
        batch.prompts = [p.text for p in prompts for _ in range(G)]
        batch.completions = texts
        batch.metrics["rollout/reward_errors"] = float(errors)
        return batch

    # ---- lifecycle -------------------------------------------------------------------------------
    def encode_prompt(self, tok: Any, text: str) -> list[int]:
        """Token ids of a prompt: the chat template's user turn, or the text after BOS."""
        if self.chat_template:
            return tok.encode_chat(text, system=self.system_prompt)
        return tok.encode(text, add_bos=True)

    def start(self, policy: TrainablePolicy) -> None:
        """Start the sampler's reward workers and engine for ``policy`` (once)."""
        if self.chat_template and not getattr(policy.tokenizer, "has_chat_template", False):
            raise ValueError("data.chat_template=true needs a tokenizer with a chat template (model=hf with an "
                             "instruct model's tokenizer); the lab's character tokenizer has none")
        if self.sampler is None:
            raise ValueError("RolloutDataModule needs a sampler (the `rollout` and `reward` config groups)")
        self.context = getattr(getattr(policy.model, "config", None), "max_position_embeddings", None)
        if self.context is not None:  # refuse at start-up what the first round would
            first = self.prompts.sample(min(256, self.batch.prompts_per_iter * 8), 0)
            cut = check_context(first, [self.encode_prompt(policy.tokenizer, p.text) for p in first], self.context,
                                self.sampler.sampling.max_new_tokens, 0)
            if cut:
                log.warning("%d of %d sampled prompts leave fewer than rollout.max_new_tokens=%d positions in the "
                            "model's context (%d): their completions stop at the context and count in "
                            "rollout/truncated_frac", cut, len(first), self.sampler.sampling.max_new_tokens,
                            self.context)
        trainer = getattr(policy, "_trainer", None)
        world = trainer.world_size if trainer is not None else 1
        with preserved_rng():  # vLLM seeds the global RNGs when it starts; a resumed run starts it later
            self.sampler.start(
                PolicyBundle(policy.model, policy.tokenizer, policy.policy_path), self.prompts.reward_fn,
                self.prompts.reward_kwargs, world_size=world, precision=trainer.precision if trainer else None,
                generation_batch=-(-self.batch.prompts_per_iter // world) * self.batch.group_size)
        if self.producer is not None:  # engines that cannot run beside the update keep the schedule, not the overlap
            self.producer.background = bool(getattr(self.sampler.engine, "overlaps_update", False))

    def teardown(self, stage: str) -> None:
        if self.producer is not None:
            self.producer.close()
        if self.sampler is not None:
            self.sampler.close_rewards()

    def close(self) -> None:
        if self.producer is not None:
            self.producer.close()
        if self.sampler is not None:
            self.sampler.close()


def build_batch(
    prompt_ids: list[list[int]], gens: list[list[Generation]], rewards: list[float], group_size: int, pad_id: int
) -> RolloutBatch:
    """Right-padded [B, L] tensors from per-prompt generations (rows of a group are contiguous)."""
    rows, resp_starts, lps, truncated = [], [], [], []
    for p, per_prompt in zip(prompt_ids, gens, strict=True):
        if len(per_prompt) != group_size:
            raise RuntimeError(f"engine returned {len(per_prompt)} completions for a prompt, expected {group_size}")
        for g in per_prompt:
            rows.append(p + g.token_ids)
            resp_starts.append(len(p))
            lps.append(g.logprobs)
            truncated.append(bool(g.truncated))
    width = max(len(r) for r in rows)
    # Padded Python lists, then one tensor each (a tensor per row is most of the cost at 1,024 rows).
    input_ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows], dtype=torch.long)
    lengths = torch.tensor([len(r) for r in rows])
    starts = torch.tensor(resp_starts)
    cols = torch.arange(width)
    attention = cols[None, :] < lengths[:, None]
    response = attention & (cols[None, :] >= starts[:, None])
    sampler_logp = torch.tensor([[0.0] * s + (lp or [0.0] * (len(r) - s)) + [0.0] * (width - len(r))
                                 for r, s, lp in zip(rows, resp_starts, lps, strict=True)], dtype=torch.float32)
    group_index = torch.arange(len(prompt_ids)).repeat_interleave(group_size)
    flat = [g for per_prompt in gens for g in per_prompt]
    kept = None
    if flat and all(g.kept is not None for g in flat):  # the engine reported its top-p / top-k kept sets
        kept = torch.tensor([[0] * s + g.kept + [0] * (width - s - len(g.kept))
                             for s, g in zip(resp_starts, flat, strict=True)], dtype=torch.long)
    return RolloutBatch(
        input_ids=input_ids, attention_mask=attention, response_mask=response,
        rewards=torch.tensor(rewards, dtype=torch.float32), group_index=group_index, group_size=group_size,
        sampler_logp=sampler_logp, sampler_kept=kept, truncated=torch.tensor(truncated, dtype=torch.bool),
    )


def rollout_metrics(batch: RolloutBatch, gens: list[Generation], texts: list[str], threshold: float) -> dict:
    rewards = batch.rewards
    correct = rewards >= threshold
    grouped = rewards.view(-1, batch.group_size)
    distinct: dict[int, set] = defaultdict(set)
    for i, (ok, text) in enumerate(zip(correct.tolist(), texts, strict=True)):
        if ok:
            distinct[i // batch.group_size].add(text.strip())
    num_prompts = grouped.shape[0]
    sampler = {}
    if gens and all(g.entropy is not None for g in gens):  # token-weighted, as rollout/entropy is
        tokens = sum(len(g.entropy) for g in gens)
        sampler["rollout/sampler_entropy"] = sum(sum(g.entropy) for g in gens) / max(1, tokens)
    return {
        **sampler,
        "rollout/reward_mean": float(rewards.mean()),
        "rollout/accuracy": float(correct.float().mean()),
        "rollout/response_len_mean": float(batch.response_mask.sum(-1).float().mean()),
        "rollout/truncated_frac": sum(g.truncated for g in gens) / max(1, len(gens)),
        "rollout/zero_std_frac": float((grouped.max(-1).values == grouped.min(-1).values).float().mean()),
        "rollout/distinct_correct": sum(len(s) for s in distinct.values()) / max(1, num_prompts),
    }


def check_context(prompts: Sequence[Any], prompt_ids: Sequence[list[int]], context: int | None, max_new_tokens: int,
                  iteration: int) -> int:
    """Refuse a prompt that does not fit the model's context (it would leave no room for a completion), naming it;
    return how many prompts leave fewer than ``max_new_tokens`` positions (their completions are cut at the
    context and counted as truncated)."""
    if context is None:
        return 0
    cut = 0
    for i, (p, ids) in enumerate(zip(prompts, prompt_ids, strict=True)):
        if len(ids) >= context:
            raise ValueError(f"prompt {i} of iteration {iteration} ({p.text[:60]!r}...) is {len(ids)} tokens, the "
                             f"model's context is {context}: shorten it or drop it from the data")
        cut += len(ids) + max_new_tokens > context
    return cut
