import os
import signal
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")  # tests never download a data set
# The real math sets, when a folder of them sits next to the checkout as shared/data; the
# tests that need them skip with the reason otherwise.
if "LIT_ENTROPY_DATA" not in os.environ and (ROOT.parent / "shared" / "data").is_dir():
    os.environ["LIT_ENTROPY_DATA"] = str(ROOT.parent / "shared" / "data")
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


@pytest.fixture(autouse=True)
def _sigint_restored():
    """Each test starts and ends with this process's SIGINT disposition unchanged.

    Lightning answers a KeyboardInterrupt in ``fit`` by ignoring SIGINT for good; a test that leaves it
    so makes every later subprocess inherit the ignore (exec keeps ignored signals ignored), and the
    Ctrl-C tests then send a SIGINT the child never sees.
    """
    before = signal.getsignal(signal.SIGINT)
    yield
    if signal.getsignal(signal.SIGINT) is not before:
        signal.signal(signal.SIGINT, before)


@pytest.fixture(scope="session")
def harness():
    """The in-process run harness (tests/harness.py): the lab's warm start built once, one shared vLLM engine."""
    from tests.harness import Harness

    h = Harness()
    h.warm_start()
    yield h
    h.close()
