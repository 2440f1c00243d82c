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


def _pin_xdist_worker() -> None:
    """Under ``pytest -n N`` (``make test`` uses 2): worker i gets every N-th core, one OpenMP thread per core
    (torch, MKL and vLLM-cpu's binding), before torch is imported. Two workers each on all cores would
    oversubscribe them, which costs these models 4-8x. Subprocesses of a test inherit the pinning."""
    worker, count = os.environ.get("PYTEST_XDIST_WORKER"), int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if not worker or count < 2 or not hasattr(os, "sched_setaffinity"):
        return
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < count:
        return
    os.environ["LIT_ENTROPY_TEST_CORES"] = ",".join(map(str, cores))  # the `all_cores` fixture gives them back
    mine = cores[int(worker.removeprefix("gw")) % count :: count]
    os.sched_setaffinity(0, mine)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(len(mine))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, mine))


_pin_xdist_worker()


DEALT_FIRST = (  # seconds of one worker, measured on the 2-core AVX2 machine (docs/results.md, "Test suite")
    "tests/integration/test_distributed.py",  # ~190: the DDP and FSDP2 ranks under torchrun
    "tests/integration/test_real_lm.py",  # ~150: the real SmolLM2 weights
    "tests/integration/test_exact_resume.py",  # ~140: runs killed as processes and resumed
    "tests/integration/test_presets.py",
    "tests/integration/test_harness.py",
    "tests/integration/test_install.py",
    "tests/unit/studies/test_records.py",
    "tests/unit/policy/test_strategies.py",
    "tests/integration/test_controller_resume.py",
    "tests/docs/test_custom_task_commands.py",
    "tests/integration/test_controllers.py",
)
"""The files ``make test`` deals to its workers first, in this order (longest first); the rest follow, the files with
more tests first.

``make test`` runs ``pytest -n 2 --dist loadfile --no-loadscope-reorder``: whole files go to whichever worker is
free, in collection order. A heavy file dealt last keeps one worker busy after the other has finished; dealt first,
the short files fill in around it."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist, order the files as :data:`DEALT_FIRST` says (a file's tests keep their order)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from collections import Counter

    def file_of(item: pytest.Item) -> str:
        return item.nodeid.split("::")[0]

    counts = Counter(map(file_of, items))
    first = {name: i for i, name in enumerate(DEALT_FIRST)}

    def rank(item: pytest.Item) -> tuple[int, int, str]:
        file = file_of(item)
        return (first.get(file, len(first)), -counts[file], file)

    items.sort(key=rank)  # stable: a file's tests stay in their order


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


@pytest.fixture
def all_cores():
    """Every core the test session started with, this process pinned to them for the test (an xdist worker is
    otherwise pinned to its share): for tests that split the cores themselves."""
    if not hasattr(os, "sched_setaffinity"):
        pytest.skip("no CPU affinity on this platform")
    before = os.sched_getaffinity(0)
    cores = {int(c) for c in os.environ.get("LIT_ENTROPY_TEST_CORES", "").split(",") if c} or before
    os.sched_setaffinity(0, cores)
    yield sorted(cores)
    os.sched_setaffinity(0, before)


@pytest.fixture(scope="session")
def harness():
    """The in-process run harness (tests/harness.py): the lab's warm start, one shared vLLM engine."""
    from tests.harness import Harness

    h = Harness()
    h.warm_start()
    yield h
    h.close()
