"""Where the Hydra config tree is (lit_entropy.utils.config_path, re-exported by lit_entropy.cli): the checkout's
``conf/`` here; from an installed wheel, its own copy (tests/integration/test_install.py)."""

from __future__ import annotations

from lit_entropy.cli import config_dir
from tests.helpers import CONF


def test_config_dir_is_the_checkouts_conf_folder():
    assert config_dir() == CONF.resolve()
