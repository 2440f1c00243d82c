"""Policies: the tiny Countdown lab policy (its warm start shipped in the package) and any Hugging Face causal LM.

A policy spec's ``build()`` returns a :class:`PolicyBundle`: the trainable model, its tokenizer and a
directory holding the same weights in Hugging Face format, which the rollout engine loads at start-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger(__name__)

LAB_START = Path(__file__).with_name("lab_start")
"""The lab policy's warm start at its default settings, shipped in the package (``scripts/build_lab_start.py`` makes
it): a run at those settings starts from it instead of spending a minute or two warm-starting."""


@dataclass
class PolicyBundle:
    model: torch.nn.Module
    """The trainable causal LM (returns ``.logits``)."""
    tokenizer: Any
    """Has ``encode(text) -> list[int]``, ``decode(ids) -> str``, ``eos_id``, ``pad_id``, ``bos_id``."""
    path: str
    """Directory with the initial weights in Hugging Face format (what the rollout engine loads)."""


@dataclass
class TinyArch:
    """Architecture of the tiny Qwen2-style lab policy."""

    hidden_size: int = 128
    """Model width."""
    num_layers: int = 4
    """Transformer blocks."""
    num_heads: int = 2
    """Attention heads; ``hidden_size / num_heads`` need not equal ``head_dim``."""
    num_kv_heads: int = 2
    """Key/value heads (grouped-query attention when smaller than ``num_heads``)."""
    head_dim: int = 64
    """Per-head width. vLLM's CPU attention backend rejects 16; keep it >= 32."""
    intermediate_size: int = 384
    """MLP width."""
    max_position_embeddings: int = 64
    """Longest prompt + completion in tokens."""

    def __post_init__(self) -> None:
        if self.head_dim < 32:
            raise ValueError(f"model.arch.head_dim={self.head_dim}: vLLM's CPU backend needs head_dim >= 32")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.arch.num_heads={self.num_heads} must be a multiple of num_kv_heads={self.num_kv_heads}"
            )
        for name in ("hidden_size", "num_layers", "num_heads", "intermediate_size", "max_position_embeddings"):
            if getattr(self, name) < 1:
                raise ValueError(f"model.arch.{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class WarmStart:
    """Supervised warm-start on random correct Countdown solutions (the policy starts from here)."""

    steps: int = 800
    """Optimizer steps (0 = no warm start: a random-init policy)."""
    batch_size: int = 64
    """Sequences per step."""
    lr: float = 3e-3
    """AdamW learning rate (linear decay to 10%)."""
    seed: int = 17
    """Seed of the problems and solutions; distinct from the RL prompt stream."""


def build_tiny_qwen2(vocab_size: int, arch: TinyArch, tokenizer: Any, seed: int = 0) -> torch.nn.Module:
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=arch.hidden_size,
        intermediate_size=arch.intermediate_size,
        num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads,
        num_key_value_heads=arch.num_kv_heads,
        head_dim=arch.head_dim,
        max_position_embeddings=arch.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_id,
        eos_token_id=tokenizer.eos_id,
        pad_token_id=tokenizer.pad_id,
        torch_dtype="float32",
    )
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float()


@dataclass
class TinyLabPolicy:
    """The Countdown lab policy: a character-level tiny Qwen2, warm-started and cached on disk.

    The cache key hashes the architecture, the task and the warm-start settings, so a changed setting
    builds a new checkpoint and an unchanged one is reused (seconds instead of a minute). At the default
    settings the package ships the warm start (:data:`LAB_START`), so every machine starts from the same
    weights and nothing is built.
    """

    arch: TinyArch = field(default_factory=TinyArch)
    """Architecture."""
    warmstart: WarmStart = field(default_factory=WarmStart)
    """Supervised warm-start settings."""
    task: Any = None
    """The ``CountdownConfig`` the warm start draws problems from (defaults to the lab's)."""
    cache_dir: str = ".cache/lit_entropy"
    """Where warm-started checkpoints are kept."""
    init_seed: int = 0
    """Seed of the random initialisation."""

    lora: Any = None
    """LoRA adapters (``{r, alpha, dropout, target_modules}``, :class:`lit_entropy.policy.lora.LoRAConfig`); None = full
    fine-tuning."""
    shipped: bool = True
    """Start from the warm start shipped in the package when it was made with these settings (the defaults);
    false = warm-start on this machine (cached like any other setting). Not part of the cache key: both are the
    same computation, and differ only by the machine's arithmetic."""

    def __post_init__(self) -> None:
        from lit_entropy.policy.lora import as_lora_config

        self.lora = as_lora_config(self.lora)  # a bad key or value fails here, before the warm start
        from lit_entropy.tasks.countdown import CountdownConfig

        if isinstance(self.arch, dict):
            self.arch = TinyArch(**self.arch)
        if isinstance(self.warmstart, dict):
            self.warmstart = WarmStart(**self.warmstart)
        if self.task is None:
            self.task = CountdownConfig()
        elif isinstance(self.task, dict):
            self.task = CountdownConfig(**self.task)

    def cache_key(self) -> str:
        blob = json.dumps(
            {"arch": asdict(self.arch), "warm": asdict(self.warmstart), "task": asdict(self.task),
             "seed": self.init_seed, "v": 1},
            sort_keys=True,
        )
        return hashlib.sha256(blob.encode()).hexdigest()[:16]

    def check_prompts(self, source: Any, max_new_tokens: int, sample: int = 256) -> None:
        """Refuse, before the warm start, a prompt source this character model cannot read: characters
        outside its alphabet (they would all become one unknown token) or a prompt that, with
        ``max_new_tokens``, does not fit its context. Checks ``sample`` prompts of iteration 0."""
        from lit_entropy.policy.tokenizer import CharTokenizer

        tok = CharTokenizer.for_countdown()
        context = self.arch.max_position_embeddings
        for i, prompt in enumerate(source.sample(sample, 0)):
            unknown = sorted({ch for ch in prompt.text if ch not in tok.alphabet})
            if unknown:
                raise ValueError(
                    f"model=tiny_countdown (the lab's character model) cannot read these prompts: prompt {i} "
                    f"{prompt.text[:60]!r} has characters outside its alphabet {tok.alphabet!r}: {unknown[:10]}; "
                    "use a model with a real tokenizer: model=smollm2_135m (offline, from make setup) or model=hf "
                    "(docs/custom_task.md#which-model-reads-what)")
            need = 1 + len(prompt.text) + max_new_tokens  # BOS, the prompt, the completion
            if need > context:
                raise ValueError(
                    f"prompt {i} {prompt.text[:60]!r} needs {need} positions (BOS + {len(prompt.text)} + "
                    f"rollout.max_new_tokens={max_new_tokens}) but model.arch.max_position_embeddings={context}")

    def build(self) -> PolicyBundle:
        from transformers import Qwen2ForCausalLM

        from lit_entropy.policy.tokenizer import CharTokenizer

        shipped = shipped_start(self.cache_key()) if self.shipped else None
        if shipped:
            log.info("Starting the lab policy from the warm start shipped at %s", shipped)
        path = shipped or self._cached_warm_start()
        model = Qwen2ForCausalLM.from_pretrained(str(path), dtype=torch.float32)
        return PolicyBundle(model=with_lora(model, self.lora), tokenizer=CharTokenizer.load(path), path=str(path))

    def _cached_warm_start(self) -> Path:
        """This machine's warm start at these settings: built once (under a lock), checked by checksum when reused."""
        path = Path(self.cache_dir) / "warmstart" / self.cache_key()
        if (path / "config.json").exists() and not verify_checksums(path):
            log.warning("the warm-start cache at %s is corrupt (checksum mismatch or unreadable); rebuilding it", path)
            aside = path.with_name(f"{path.name}.corrupt-{os.getpid()}-{time.time_ns()}")
            try:
                os.replace(path, aside)  # another rank may have moved it already
            except OSError:
                pass
            shutil.rmtree(aside, ignore_errors=True)
        if not (path / "config.json").exists():
            with build_lock(path):  # a second builder (another rank, test worker or study lane) waits for the first
                if not (path / "config.json").exists():
                    self._warm_start_and_save(path)
        else:
            log.info("Reusing warm-started lab policy at %s", path)
        return path

    def _warm_start_and_save(self, path: Path) -> None:
        from lit_entropy.policy.tokenizer import CharTokenizer

        tok = CharTokenizer.for_countdown()
        model = build_tiny_qwen2(tok.vocab_size, self.arch, tok, seed=self.init_seed)
        t0 = time.perf_counter()
        stats = supervised_warm_start(model, tok, self.task, self.warmstart)
        stats["seconds"] = round(time.perf_counter() - t0, 2)
        stats["cache_key"] = self.cache_key()
        log.info("Warm start done: %s", stats)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=path.parent, prefix=".tmp-"))
        model.save_pretrained(str(tmp), safe_serialization=True)
        tok.save(tmp)
        (tmp / "warmstart.json").write_text(json.dumps(stats, indent=2))
        write_checksums(tmp)
        try:
            os.replace(tmp, path)  # atomic: a concurrent builder either wins or finds it done
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)


def shipped_start(key: str) -> Path | None:
    """The shipped warm start (:data:`LAB_START`) when it was made with the settings whose cache key is ``key`` and
    its files pass their checksums; else None (the caller warm-starts here). A shipped copy that fails its checksums
    is reported, never loaded."""
    try:
        made_for = json.loads((LAB_START / "warmstart.json").read_text()).get("cache_key")
    except (OSError, ValueError):
        return None
    if made_for != key:
        return None
    if not (LAB_START / CHECKSUMS).is_file() or not verify_checksums(LAB_START):
        log.warning("the shipped lab warm start at %s fails its checksums (a damaged install?); warm-starting here "
                    "instead", LAB_START)
        return None
    return LAB_START


@contextlib.contextmanager
def build_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path``'s sibling ``.<name>.lock`` (POSIX ``flock``; no lock where there is none),
    so concurrent processes build a cached folder once. The write itself stays atomic without it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        import fcntl
    except ImportError:  # not POSIX: concurrent builders each build, and the atomic rename keeps one
        yield
        return
    with open(path.parent / f".{path.name}.lock", "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


CHECKSUMS = "checksums.json"


def _digests(path: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(path.iterdir()) if f.is_file() and not f.name.startswith(".") and f.name != CHECKSUMS}


def write_checksums(path: Path) -> None:
    """Record the sha256 of every file of a cached checkpoint directory."""
    tmp = path / f".{CHECKSUMS}.{os.getpid()}"
    tmp.write_text(json.dumps(_digests(path), indent=1, sort_keys=True))
    os.replace(tmp, path / CHECKSUMS)  # atomic: ranks checking the same cache never read half a file


def verify_checksums(path: Path) -> bool:
    """True when every file recorded in ``checksums.json`` is there with its digest (a truncated or
    edited weight file, a missing tokenizer, a partial copy are all caught). A cache written before
    checksums existed is accepted if its weights load, and gets its checksums then."""
    record = path / CHECKSUMS
    if not record.exists():
        try:
            from safetensors.torch import load_file

            load_file(str(path / "model.safetensors"))
        except Exception:
            return False
        write_checksums(path)
        return True
    try:
        want = json.loads(record.read_text())
    except (OSError, ValueError):
        return False
    have = _digests(path)
    return all(have.get(name) == digest for name, digest in want.items())


@dataclass
class HFPolicy:
    """Any Hugging Face causal LM by hub name or local path (network needed for hub names)."""

    name_or_path: str = ""
    """Hub id or local directory."""
    dtype: str = "float32"
    """Weights dtype for training; log-probs are fp32 regardless."""
    trust_remote_code: bool = False
    """Passed to ``from_pretrained``."""
    lora: Any = None
    """LoRA adapters (``{r, alpha, dropout, target_modules}``); None = full fine-tuning."""

    def __post_init__(self) -> None:
        from lit_entropy.policy.lora import as_lora_config

        self.lora = as_lora_config(self.lora)

    def build(self) -> PolicyBundle:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        if not self.name_or_path:
            raise ValueError("model.name_or_path is empty: give a hub id or a local directory")
        model = AutoModelForCausalLM.from_pretrained(
            self.name_or_path, dtype=getattr(torch, self.dtype), trust_remote_code=self.trust_remote_code
        )
        hf_tok = AutoTokenizer.from_pretrained(self.name_or_path, trust_remote_code=self.trust_remote_code)
        from lit_entropy.policy.model_support import disable_dropout, startup_report

        dropout = disable_dropout(model)
        model = with_lora(model, self.lora)
        log.info("%s", startup_report(model) + (f"\n  dropout: off (the checkpoint's {dropout})" if dropout else ""))
        return PolicyBundle(model=model, tokenizer=HFTokenizerAdapter(hf_tok), path=self.name_or_path)


def with_lora(model: torch.nn.Module, lora: Any) -> torch.nn.Module:
    """``model`` wrapped with fresh LoRA adapters when ``lora`` is set, else as it is."""
    from lit_entropy.policy.lora import apply_lora, as_lora_config

    cfg = as_lora_config(lora)
    return model if cfg is None else apply_lora(model, cfg)


class HFTokenizerAdapter:
    """Gives a Hugging Face tokenizer the small interface the rest of the package uses."""

    def __init__(self, tok: Any) -> None:
        self.hf = tok
        self.eos_id = int(tok.eos_token_id)
        self.pad_id = int(tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id)
        self.bos_id = int(tok.bos_token_id) if tok.bos_token_id is not None else None
        self.vocab_size = len(tok)

    def encode(self, text: str, add_bos: bool = False) -> list[int]:
        ids = self.hf.encode(text, add_special_tokens=False)
        return ([self.bos_id] if add_bos and self.bos_id is not None else []) + ids

    def decode(self, ids: list[int], skip_special: bool = True) -> str:
        return self.hf.decode(ids, skip_special_tokens=skip_special)

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.hf, "chat_template", None))

    def encode_chat(self, text: str, system: str | None = None) -> list[int]:
        """``text`` as the user's turn (after an optional system turn), ending with the assistant's prompt."""
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": text}]
        rendered = self.hf.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return self.hf.encode(rendered, add_special_tokens=False)


def supervised_warm_start(model: torch.nn.Module, tok: Any, task: Any, cfg: WarmStart) -> dict:
    """Teacher-force random correct solutions; loss on completion tokens (and EOS) only."""
    from lit_entropy.tasks.countdown import format_prompt, generate_problems, random_solution

    if cfg.steps <= 0:
        return {"steps": 0}
    rng = random.Random(cfg.seed)
    problems = generate_problems(cfg.steps * cfg.batch_size // 4 + 64, seed=cfg.seed, config=task)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 - 0.9 * s / max(1, cfg.steps))
    model.train()
    losses = []
    for _ in range(cfg.steps):
        rows, masks = [], []
        for problem in rng.sample(problems, cfg.batch_size):
            prompt = tok.encode(format_prompt(problem), add_bos=True)
            answer = random_solution(problem, rng, use_all=task.use_all)
            completion = tok.encode(answer) + [tok.eos_id]
            rows.append(prompt + completion)
            masks.append([0] * len(prompt) + [1] * len(completion))
        width = max(len(r) for r in rows)
        ids = torch.tensor([r + [tok.pad_id] * (width - len(r)) for r in rows])
        loss_mask = torch.tensor([m + [0] * (width - len(m)) for m in masks], dtype=torch.float32)
        attn = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")
        loss = (nll * loss_mask[:, 1:]).sum() / loss_mask[:, 1:].sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(loss.item())
    model.eval()
    tail = losses[-20:]
    return {"steps": cfg.steps, "final_loss": round(sum(tail) / len(tail), 4)}
