"""From command-line arguments to engine processes.

Composes and checks the config (``ssl_engine.engines.prelaunch``), then either joins a world
started by torchrun (rank variables already in the environment) or starts ``NUM_PROC_PER_NODE``
processes on this machine. The process where global rank 0 runs (this one, or torchrun's
rank 0) holds the lock of ``CHECKPOINT.DIR`` for the life of the run
(``ssl_engine.utils.run_lock``).
"""
import contextlib
import logging
import os
import shutil
import socket
import sys
import uuid
from pathlib import Path
from typing import Callable, Optional, Sequence, Tuple

import torch.distributed as dist
import torch.multiprocessing as mp

from ssl_engine.checkpoint import CheckpointError, remove_unfinished_saves
from ssl_engine.config import AttrDict, ConfigError
from ssl_engine.engines import get_engine
from ssl_engine.engines.plugins import import_plugins
from ssl_engine.engines.prelaunch import holds_run_lock, load_checked_config, started_by_torchrun
from ssl_engine.engines.slurm import is_local, submit
from ssl_engine.extraction.errors import ExtractionError
from ssl_engine.trainer.process import die_with_launcher
from ssl_engine.trainer.run_position import RunAlreadyComplete
from ssl_engine.trainer.trainer import USER_ERRORS
from ssl_engine.utils.logger import launcher_logging
from ssl_engine.utils.oom import cgroup_oom_kills, lower_memory_hint, oom_evidence
from ssl_engine.utils.registry import UnknownNameError
from ssl_engine.utils.run_lock import RunLock, RunLockError, process_start
from ssl_engine.utils.stop_request import (RunStopped, launcher_stop_signals, signal_name,
                                           stop_signals)

logger = logging.getLogger(__name__)

SPAWN_GRACE_S = 10.0
# what a forkserver imports once, so that the processes forked from it start with the engine
# loaded (the server is started by the first launch and serves every later launch of this
# process, e.g. a notebook's or a test session's runs)
FORKSERVER_PRELOAD = ["ssl_engine.engines.launcher"]


def find_free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dist_run_id(cfg: AttrDict) -> str:
    """The torch.distributed init method for this run."""
    method, run_id = cfg.DISTRIBUTED.INIT_METHOD, cfg.DISTRIBUTED.RUN_ID
    if method == "env" or started_by_torchrun():
        return "env://"
    if method == "tcp":
        if run_id == "auto":
            if cfg.DISTRIBUTED.NUM_NODES > 1:
                raise ConfigError("config.DISTRIBUTED.RUN_ID=auto works on one node only; "
                                  "give host:port of node 0 for NUM_NODES > 1")
            return f"tcp://127.0.0.1:{find_free_port()}"
        return f"tcp://{run_id}"
    if run_id == "auto":
        if cfg.DISTRIBUTED.NUM_NODES > 1:
            raise ConfigError("config.DISTRIBUTED.RUN_ID=auto works on one node only; "
                              "give a file path on a shared file system for NUM_NODES > 1")
        Path(cfg.CHECKPOINT.DIR).mkdir(parents=True, exist_ok=True)
        run_id = os.path.join(cfg.CHECKPOINT.DIR, f".dist_init_{uuid.uuid4().hex}")
    return f"file://{os.path.abspath(run_id)}"


@contextlib.contextmanager
def _rank_environment(cfg: AttrDict, local_rank: int):
    """RANK / LOCAL_RANK / WORLD_SIZE of this process while the engine runs (torchrun's own
    variables are kept as they are); restored afterwards, so a later run in the same
    process does not mistake them for a torchrun world."""
    if started_by_torchrun():
        yield
        return
    nproc = cfg.DISTRIBUTED.NUM_PROC_PER_NODE
    values = {
        "LOCAL_RANK": str(local_rank),
        "RANK": str(cfg.DISTRIBUTED.NODE_ID * nproc + local_rank),
        "WORLD_SIZE": str(cfg.DISTRIBUTED.NUM_NODES * nproc),
    }
    saved = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class RankUserError(RuntimeError):
    """An error a user caused (USER_ERRORS, ExtractionError) in a spawned process: its
    message, reported instead of the errors it set off in the other processes."""


def _signals_of(engine, shared_stop=None):
    """SIGTERM / SIGINT handled by the engine (a clean stop), if it can."""
    return stop_signals(shared_stop) if engine.stops_on_signal else contextlib.nullcontext()


def _parent_state() -> dict:
    """What a started process takes from the launcher at the time of the launch: its
    environment (plugins, torch.distributed's and the user's variables), working folder and
    import path. A spawned process inherits them anyway; one forked from the forkserver would
    otherwise have the forkserver's, from the time the server was started."""
    return {"environ": dict(os.environ), "cwd": os.getcwd(), "sys_path": list(sys.path)}


def _take_parent_state(state: dict) -> None:
    os.environ.clear()
    os.environ.update(state["environ"])
    os.chdir(state["cwd"])
    sys.path[:] = state["sys_path"]


def _run_process(local_rank: int, engine_name: str, cfg: AttrDict, run_id: str,
                 checkpoint_path: Optional[str], hook_generator,
                 error_dir: Optional[str] = None, shared_stop=None,
                 parent_state: Optional[dict] = None,
                 launcher: Optional[Tuple[int, Optional[int]]] = None) -> None:
    if launcher is not None:  # a started process: it ends with the launcher (pid, start)
        die_with_launcher(launcher, local_rank)
    if parent_state is not None:
        _take_parent_state(parent_state)
    import_plugins()
    engine = get_engine(engine_name)
    kwargs = {"checkpoint_path": checkpoint_path}
    if hook_generator is not None:
        kwargs["hook_generator"] = hook_generator
    with _rank_environment(cfg, local_rank), _signals_of(engine, shared_stop):
        try:
            engine(cfg, run_id, **kwargs)
        except (ExtractionError, *USER_ERRORS) as err:
            # written before this process leaves the process group, hence before the others
            # fail on its absence
            if error_dir is not None:
                Path(error_dir, f"{local_rank:05d}.txt").write_text(str(err))
            raise
        except RunStopped as stopped:  # a clean stop: every process ends without an error
            if error_dir is None:
                raise
            if local_rank == 0:
                Path(error_dir, STOP_REPORT).write_text(f"{stopped.signum}\n{stopped}")
        finally:
            if dist.is_initialized():
                dist.destroy_process_group()
    if error_dir is not None:  # a spawned process whose run succeeded: nothing is left to do.
        # Leave without the interpreter's teardown, where a native library's thread destroyed
        # while still joinable once aborted an FSDP rank (SIGABRT, "terminate called without
        # an active exception") after its run had finished and saved everything.
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


STOP_REPORT = "stopped.txt"


@contextlib.contextmanager
def _report_folder(cfg: AttrDict):
    """A folder where spawned processes leave the message of their failure or clean stop, in
    CHECKPOINT.DIR (one per node), removed at the end; one left by a killed launcher is
    replaced by the next launch."""
    folder = Path(cfg.CHECKPOINT.DIR, f".rank_reports.node{cfg.DISTRIBUTED.NODE_ID}")
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    try:
        yield str(folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _abort_at_once(context):
    """What a second SIGTERM / SIGINT does to the launcher: kill its processes, leave."""
    def abort(signum: int) -> None:
        for process in context.processes:
            if process.is_alive():
                process.kill()
        print(f"error: stopped at once by a second {signal_name(signum)}: the processes were "
              "killed without saving. Checkpoints already written are intact: run again with "
              "config.CHECKPOINT.AUTO_RESUME=true", file=sys.stderr, flush=True)
        os._exit(128 + signum)

    return abort


def start_method(cfg: AttrDict) -> str:
    """How the processes of a node are started: config.MULTI_PROCESSING_METHOD, forkserver
    (VISSL's default) or spawn. ``fork`` is read as forkserver: a process whose torch has run
    parallel work cannot be forked safely (its thread pools do not survive the fork), and a
    forkserver forks from a clean process that only imported the engine."""
    return "spawn" if cfg.get("MULTI_PROCESSING_METHOD", "forkserver") == "spawn" \
        else "forkserver"


def _spawn(nproc: int, engine_name: str, cfg: AttrDict, run_id: str,
           checkpoint_path: Optional[str], hook_generator,
           on_started: Optional[Callable[[Sequence[int]], None]] = None) -> None:
    """``nproc`` processes; when one fails on an error a user caused, RankUserError with its
    message (the others then fail too, on the missing process: those errors say nothing).
    After a failure the others have SPAWN_GRACE_S seconds to end by themselves (and release
    what their data-loader workers hold) before they are terminated. A SIGTERM / SIGINT to
    this process is passed to them (a value they share) when the engine stops on signals:
    they stop cleanly and RunStopped is raised here. They end with this process however it
    ends (``die_with_launcher``); ``on_started`` gets their pids once they are started."""
    method = start_method(cfg)
    if method == "forkserver":
        mp.set_forkserver_preload(FORKSERVER_PRELOAD)  # no effect once the server runs
    shared_stop = mp.get_context(method).RawValue("i", 0)  # the signal that stopped the run
    with _report_folder(cfg) as error_dir:
        try:
            context = mp.start_processes(
                _run_process, args=(engine_name, cfg, run_id, checkpoint_path, hook_generator,
                                    error_dir, shared_stop, _parent_state(),
                                    (os.getpid(), process_start(os.getpid()))),
                nprocs=nproc, join=False, start_method=method)
            if on_started is not None:
                on_started([process.pid for process in context.processes])
            signals = launcher_stop_signals(shared_stop, _abort_at_once(context)) \
                if get_engine(engine_name).stops_on_signal else contextlib.nullcontext()
            with signals:
                while not context.join(grace_period=SPAWN_GRACE_S):
                    pass
        except (mp.ProcessRaisedException, mp.ProcessExitedException):
            reports = sorted(Path(error_dir).glob("[0-9]*.txt"))
            if reports:
                raise RankUserError(reports[0].read_text()) from None
            raise
        stop_report = Path(error_dir, STOP_REPORT)
        if stop_report.exists():
            signum, message = stop_report.read_text().split("\n", 1)
            raise RunStopped(message, int(signum))


def launch_distributed(cfg: AttrDict, engine_name: str, checkpoint_path: Optional[str] = None,
                       hook_generator: Optional[Callable] = None) -> None:
    """Run ``engine_name`` in this process (one process, or under torchrun) or in
    ``NUM_PROC_PER_NODE`` spawned processes, holding the lock of CHECKPOINT.DIR (RunLockError
    if another live run holds it, or if it cannot be written); the lock lists the spawned
    processes too."""
    holds_lock = holds_run_lock(cfg)
    with RunLock(cfg.CHECKPOINT.DIR) if holds_lock else contextlib.nullcontext() as lock:
        if holds_lock:
            remove_unfinished_saves(cfg.CHECKPOINT.DIR)
        run_id = dist_run_id(cfg)
        nproc = cfg.DISTRIBUTED.NUM_PROC_PER_NODE
        if started_by_torchrun() or nproc == 1:
            _run_process(0, engine_name, cfg, run_id, checkpoint_path, hook_generator)
        else:
            _spawn(nproc, engine_name, cfg, run_id, checkpoint_path, hook_generator,
                   on_started=lock.add_processes if holds_lock else None)


def submit_to_slurm(cfg: AttrDict, engine_name: str) -> int:
    """Submit the run with submitit and print the job id and log folder; without SLURM (the
    local executor) wait for the job and return its outcome."""
    job = submit(cfg, engine_name, launch_distributed)
    print(f"submitted job {job.job_id}; its logs: {job.paths.folder}", flush=True)
    if not is_local(job):  # on SLURM: the job runs there
        return 0
    try:
        job.result()  # the local executor: this machine runs it
    except Exception as err:  # submitit's FailedJobError carries the job's traceback
        lines = [line for line in str(err).strip().splitlines() if line.strip()]
        print(f"error: job {job.job_id} failed: {lines[-1] if lines else err}; its logs: "
              f"{job.paths.stderr}", file=sys.stderr)
        return 1
    print(f"job {job.job_id} finished; checkpoints in {cfg.CHECKPOINT.DIR}", flush=True)
    return 0


def main(argv: Sequence[str]) -> int:
    """The command line: ``config=<group>/<name> [engine_name=...] [config.A.B=v ...]``."""
    # mp.spawn logs a warning for each process it stops after one failed: the error says it all
    logging.getLogger("torch.multiprocessing.spawn").setLevel(logging.ERROR)
    with launcher_logging():  # what composing and checking report (e.g. auto lr scaling)
        return _main(argv)


def _main(argv: Sequence[str]) -> int:
    try:
        engine_name, cfg = load_checked_config(argv)  # every check, in engines/prelaunch.py
    except RunAlreadyComplete as done:  # a shortened run resumed past its end
        print(done, file=sys.stderr)
        return 0
    except (ConfigError, FileNotFoundError, NotADirectoryError, UnknownNameError,
            CheckpointError, ExtractionError, ValueError, RunLockError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kills_before = cgroup_oom_kills()  # what says, if a process is killed, why
    try:
        if cfg.SLURM.USE_SLURM:
            return submit_to_slurm(cfg, engine_name)
        launch_distributed(cfg, engine_name)
    except RunLockError as err:  # another launch took the folder since the check
        print(f"error: {err}", file=sys.stderr)
        return 2
    except mp.ProcessRaisedException as err:
        last = str(err).strip().splitlines()[-1]
        print(f"error: a process failed: {last}", file=sys.stderr)
        return 1
    except mp.ProcessExitedException as err:  # a rank died without raising (killed, OOM)
        evidence = (oom_evidence(err.error_pid, kills_before)
                    if err.signal_name == "SIGKILL" else None)
        if evidence is not None:
            print(f"error: process {err.error_index} (pid {err.error_pid}) ran out of memory: "
                  f"{evidence}; the other processes were stopped. To fit, "
                  f"{lower_memory_hint()}", file=sys.stderr)
            return 1
        print(f"error: {err}; the other processes were stopped. Checkpoints already written "
              "are intact: run again with config.CHECKPOINT.AUTO_RESUME=true", file=sys.stderr)
        return 1
    except (RankUserError, ExtractionError, *USER_ERRORS) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    except RunStopped as stopped:  # SIGTERM / SIGINT: a clean stop, not a failure
        print(stopped, file=sys.stderr)
        return stopped.exit_code
    return 0
