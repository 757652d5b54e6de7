"""Shared test fixtures: offline settings, a tiny random BERT, the shared data, local Ray."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

# Offline and out of $HOME before anything imports transformers or deepspeed: the test machines
# have no internet, and the jobs leave the hub as the environment says (a user's cluster loads
# hub models), so the harness switches it off for itself and every process it starts (jobs,
# Ray workers, submitted jobs: harness/autoscaling_cluster.py HUB_OFFLINE). The jobs' own
# environment defaults (runtime.ENVIRONMENT_DEFAULTS: one tokenizer thread, Ray Data's footer
# actors...) are set when cli is imported, which imports none of those, so that tests that start
# Ray or read data themselves run as a job does.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# No progress bars or lines from long work in the test logs (progress_report.py; its own tests
# set the mode they check).
os.environ.setdefault("DISTRIBUTED_EMB_PROGRESS", "off")
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "1")
# Ray Train's controller polls its workers every 2 s and moves a run from one state to the next
# (started, running, finished) only at a poll: a tiny run waits several seconds for nothing. The
# suite makes ~40 Train runs; every Ray it starts (shared, jobs, heads, clusters) inherits this.
# A slow poll is only a missed health check (fatal after 10 min), so nothing else changes.
os.environ.setdefault("RAY_TRAIN_HEALTH_CHECK_INTERVAL_S", "0.5")
# torch's OpenMP threads wait for the next parallel region by spinning (libgomp's default), and
# a tiny model's operators are microseconds apart, so its idle threads spin nearly all the time.
# The suite runs two lanes and their Ray workers on two cores: every spinning thread takes a
# core from a process with work. Measured under the suite's load, 300 training steps of the tiny
# BERT with torch's 2 threads: 8.2-10.5 core-seconds (6.1-7.8 s) spinning, 2.4-2.6 (2.4-2.6 s)
# sleeping. Read by libgomp when torch loads, so set here, before anything imports torch; every
# process the suite starts inherits it.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from harness import lanes, local_ray  # noqa: E402

import distributed_emb.runtime  # noqa: E402, F401

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session", autouse=True)
def _isolated_caches(tmp_path_factory):
    cache = tmp_path_factory.mktemp("caches")
    os.environ.setdefault("HF_HOME", str(cache / "hf"))
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions"))
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    yield


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The real evaluation data and corpora in SentEval layout (STS-B, SICK-R, transfer tasks,
    STS12–16 samples, Wikipedia and Lee corpora): DISTRIBUTED_EMB_SHARED_DATA, else the
    `shared/data` directory beside this checkout. Tests that need it skip without it."""
    candidates = [REPO.parent / "shared" / "data"]
    if "DISTRIBUTED_EMB_SHARED_DATA" in os.environ:
        candidates.insert(0, Path(os.environ["DISTRIBUTED_EMB_SHARED_DATA"]))
    for path in candidates:
        if path.is_dir():
            return path
    pytest.skip(
        "no shared evaluation data: set DISTRIBUTED_EMB_SHARED_DATA to a directory holding "
        "senteval/downstream and corpus/"
    )


@pytest.fixture(scope="session")
def senteval_dir(shared_data_dir) -> Path:
    return shared_data_dir / "senteval" / "downstream"


@pytest.fixture(scope="session")
def minilm_path() -> str:
    from distributed_emb.paths import default_model_path

    return default_model_path()


def build_tiny_bert(directory: Path, hidden: int = 32, layers: int = 2, seed: int = 0) -> str:
    """A random-initialised BERT with MiniLM's tokenizer: real tokenisation, tiny compute."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    from distributed_emb.paths import default_model_path

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    config = BertConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=2,
        intermediate_size=2 * hidden,
        max_position_embeddings=128,
        hidden_dropout_prob=0.1,
        attention_probs_dropout_prob=0.1,
    )
    torch.manual_seed(seed)
    # Saved with an MLM head so the β·L_MLM path has real weights to load.
    BertForMaskedLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return str(directory)


@pytest.fixture(scope="session")
def cpp_compiler() -> str:
    """torch.compile on CPU builds its kernels with a C++ compiler: its path, or a skip."""
    compiler = shutil.which("c++") or shutil.which("g++")
    if compiler is None:
        pytest.skip(
            "torch.compile on CPU builds its kernels with a C++ compiler; none is installed"
        )
    return compiler


@pytest.fixture(scope="session")
def tiny_bert_path(tmp_path_factory) -> str:
    return build_tiny_bert(tmp_path_factory.mktemp("tiny_bert"))


# ---------------------------------------------------------------------------------------------
# Ray: one local instance for the session (tests/harness/local_ray.py)
# ---------------------------------------------------------------------------------------------

_SHARED_RAY_MODULES = pytest.StashKey[set]()


def pytest_collection_modifyitems(config, items):
    shared = local_ray.shared_ray_modules(items)
    config.stash[_SHARED_RAY_MODULES] = shared
    items[:] = local_ray.order_shared_ray_modules(items, shared)


def pytest_xdist_make_scheduler(config, log):
    """`pytest -n N`: one lane of whole modules per worker (harness/lanes.py), unless another
    `--dist` mode is asked for."""
    if config.getvalue("dist") == "load":
        return lanes.LaneScheduling(config, log)
    return None


@pytest.fixture(autouse=True)
def _shared_ray_only_where_used(request):
    """A module that does not use the shared instance may start its own Ray, a `ray start`
    head or a cluster: the shared one is stopped first. The ordering runs every shared module
    after the others, so in a whole-suite run this finds nothing to stop."""
    if request.node.module not in request.config.stash.get(_SHARED_RAY_MODULES, set()):
        local_ray.stop_shared_ray()
    yield


@pytest.fixture
def ray_local(request):
    """The session's local Ray (as many logical CPUs as the machine has cores; workers at the
    driver's priority and no preemption watcher, as runtime.start_ray starts a local run's). Train
    runs, annotation and evaluation pools fit through the resource plan, as a user's run on the
    same machine does. After the test every CPU must be free again, or the test fails naming
    the actors and placement groups that hold them."""
    yield local_ray.start_shared_ray()
    local_ray.assert_resources_released(request.node.nodeid)


@pytest.fixture(scope="session", autouse=True)
def _stop_shared_ray_at_the_end():
    yield
    local_ray.stop_shared_ray()


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory, tiny_bert_path):
    """(config, TrainingResult) of the session's one finished tiny training run (see
    harness/tiny_run.py): tests that need its outputs also ask for `ray_local`."""
    from harness.tiny_run import finished_tiny_run

    local_ray.start_shared_ray()
    return finished_tiny_run(tiny_bert_path, tmp_path_factory.mktemp("tiny_run"))


@pytest.fixture(scope="session")
def s3():
    """An S3-protocol server on 127.0.0.1 for the whole session. Session-scoped so that its
    endpoint is in the environment before any Ray instance starts (workers inherit it)."""
    from harness.s3 import loopback_s3

    # Workers inherit the environment their instance started with: a shared instance started
    # before the endpoint was set would not reach the server.
    local_ray.stop_shared_ray()
    with loopback_s3() as server:
        yield server
