"""The registries' shared helpers (lit_entropy/utils/registries.py): one name once, and a folder's files in order."""

from __future__ import annotations

import sys

import pytest

from lit_entropy.utils.registries import add_once, import_submodules


def test_a_name_is_registered_once() -> None:
    registry: dict[str, int] = {}
    add_once(registry, "grpo", 1, "advantage estimator")
    with pytest.raises(ValueError, match="advantage estimator 'grpo' is registered twice"):
        add_once(registry, "grpo", 2, "advantage estimator")
    assert registry == {"grpo": 1}


def test_every_file_of_a_folder_is_imported_in_the_order_of_its_name(tmp_path, monkeypatch) -> None:
    package = tmp_path / "reg_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("ORDER = []\n")
    for name in ("zeta", "alpha", "mid"):
        (package / f"{name}.py").write_text(f"from reg_pkg import ORDER\nORDER.append({name!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import reg_pkg

    try:
        import_submodules("reg_pkg", reg_pkg.__path__)
        assert reg_pkg.ORDER == ["alpha", "mid", "zeta"]
    finally:
        for key in [k for k in sys.modules if k == "reg_pkg" or k.startswith("reg_pkg.")]:
            del sys.modules[key]
