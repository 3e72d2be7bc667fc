"""Where the runs of a sweep execute: this process, local worker processes, or
a Dask cluster.

An executor gets the whole list of pending :class:`Task` s at once and yields
``(task, outcome)`` as runs finish, in any order; ``outcome`` is what
:func:`evaluate` returns for the task (the run's metrics under ``"metrics"``,
with its time and the environment that ran it) or the exception the run
raised. A custom executor (``optical.sweep.Executor``) calls
``optical.sweep.evaluate(task)`` where it runs a task. Getting the whole list lets an executor
batch runs (:class:`VmapExecutor` ``vmap`` s the JAX tasks that differ only in
numeric noise parameters and seeds). Closing the generator early (an error,
Ctrl-C, SIGTERM turned into SystemExit) cancels what has not started and stops
the workers: the sweep keeps every run it already recorded.

A run's result depends only on (workload, config, seed), whichever executor
runs it.
"""

from __future__ import annotations

import abc
import concurrent.futures as cf
import dataclasses
import errno
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import time
import traceback
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from optical._files import cwd_deleted
from optical._validation import check_positive_int
from optical._version import RESULTS_VERSION, __version__
from optical.config import OpticalConfig
from optical.kernels import environment

__all__ = ["DaskExecutor", "Executor", "ProcessExecutor", "SerialExecutor", "Task",
           "VmapExecutor", "evaluate", "make_executor"]

#: Environment variables that size the thread pools of numerical libraries.
_THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                "NUMBA_NUM_THREADS", "VECLIB_MAXIMUM_THREADS")


@dataclasses.dataclass(frozen=True)
class Task:
    """One run: a workload at one point of the sweep with one seed."""

    run_id: str
    point: int
    seed: int
    workload: Any
    config: OpticalConfig


def _portable(task: Task) -> dict[str, Any]:
    """:func:`evaluate` in a worker process or on a Dask worker: an exception
    that would not survive the trip back (one whose ``__init__`` takes other
    arguments than its ``args``, say) comes back as a RuntimeError holding its
    type, message and traceback; else the pool reports a broken worker, on
    another run, and drops the cause."""
    try:
        return evaluate(task)
    except Exception as err:
        try:
            pickle.loads(pickle.dumps(err))
        except Exception:
            detail = "".join(traceback.format_exception(err)).rstrip()
            raise RuntimeError(f"{type(err).__name__}: {err} (an exception that cannot be "
                               f"sent back from the worker; its traceback there:\n{detail})"
                               ) from None
        raise


def evaluate(task: Task) -> dict[str, Any]:
    """Run one task; returns its metrics and the seconds it took."""
    start = time.perf_counter()
    try:
        metrics = task.workload.run(task.config, task.seed)
    except SystemExit as stop:
        if type(stop) is not SystemExit:  # a stop signal (the sweep's Terminated) stops all
            raise
        # sys.exit in a run ended the sweep in this process, failed the run in
        # worker processes and killed a Dask worker thread (the sweep then hung).
        raise RuntimeError(f"{type(task.workload).__name__}.run called sys.exit("
                           f"{stop.code!r}); a run must return its metrics or raise an "
                           "exception") from None
    if not isinstance(metrics, dict):
        raise TypeError(f"{type(task.workload).__name__}.run returned "
                        f"{type(metrics).__name__}, expected a dict of metrics")
    return run_outcome(metrics, time.perf_counter() - start)


def utc_now() -> str:
    """This process's clock now, UTC, ISO 8601 to the second (a run's ``finished_at``)."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def run_outcome(metrics: dict[str, Any], elapsed_s: float, *,
                vmap_batch: int | None = None) -> dict[str, Any]:
    """A finished run's outcome, with what the process that ran it runs: the
    numpy, numba and JAX versions and optical's own (a Dask worker's may not
    be the driver's), and when it finished by that process's clock (UTC, ISO
    8601 to the second). ``vmap_batch``: the runs computed with it in one
    ``run_batch`` (a ``jax.vmap``, whose traced seed XLA may compile to
    other roundings than a run alone's); None for a run alone."""
    return {"metrics": metrics, "elapsed_s": elapsed_s, "finished_at": utc_now(),
            "environment": environment(), "optical_version": __version__,
            "results_version": RESULTS_VERSION, "vmap_batch": vmap_batch}


Outcome = dict[str, Any] | BaseException


class Executor(abc.ABC):
    """Runs sweep tasks; see the module docstring for the contract."""

    @abc.abstractmethod
    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[Task, Outcome]]:
        """Yield ``(task, outcome)`` for every task, as each finishes."""

    def close(self) -> None:  # noqa: B027 - optional hook, nothing to release by default
        """Release the workers this executor started (not borrowed ones)."""

    def describe(self) -> str:
        """A line saying where the runs went (the sweep's summary and errors)."""
        return type(self).__name__


class SerialExecutor(Executor):
    """Every run in this process, one after another."""

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[Task, Outcome]]:
        """Run each task here, one after the other."""
        for task in tasks:
            try:
                outcome: Outcome = evaluate(task)
            except Exception as err:  # noqa: BLE001 - reported by the sweep with the task
                outcome = err
            yield task, outcome

    def describe(self) -> str:
        """Where the runs went: this process."""
        return "this process"


class VmapExecutor(Executor):
    """Runs in this process, batched: tasks of one workload whose configs share
    the workload's ``batch_key`` (e.g. the JAX matmul workload's configs that
    differ only in seed and numeric noise fields) go through one
    ``run_batch`` call (a ``jax.vmap``); other tasks run one by one.

    Parameters
    ----------
    batch_size : int
        Most runs per batch (bounds the memory of the batched outputs).
    """

    def __init__(self, batch_size: int = 64) -> None:
        self.batch_size = check_positive_int(batch_size, "batch_size")
        self.batched = self.single = 0  # runs of the last call in batches / one by one

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[Task, Outcome]]:
        """Batch the tasks whose workload and ``batch_key`` agree through one
        ``run_batch``; run the others one by one, here."""
        from optical._sweep_store import content_hash  # (it imports Task from here)

        self.batched = self.single = 0  # describe() tells of this call alone
        groups: dict[tuple[str, str], list[Task]] = {}
        for task in tasks:
            key_of = getattr(task.workload, "batch_key", None)
            key = key_of(task.config) if key_of is not None else None
            if key is None:
                self.single += 1
                yield from SerialExecutor().run([task])
                continue
            groups.setdefault((content_hash(task.workload.to_dict()), key),
                              []).append(task)
        for group in groups.values():
            for i in range(0, len(group), self.batch_size):
                batch = group[i:i + self.batch_size]
                self.batched += len(batch)
                start = time.perf_counter()
                try:
                    results = batch[0].workload.run_batch([t.config for t in batch],
                                                          [t.seed for t in batch])
                    listed = (None if isinstance(results, Mapping | str | bytes)
                              or not isinstance(results, Iterable) else list(results))
                    returned = f"{type(batch[0].workload).__name__}.run_batch returned"
                    expected = ("it returns a list of metrics dicts, one per config and seed, "
                                "in their order")
                    if listed is None or len(listed) != len(batch):
                        got = (f"{len(listed)} results" if listed is not None
                               else f"a {type(results).__name__}")
                        raise ValueError(f"{returned} {got} for {len(batch)} runs: {expected}")
                    wrong = [type(m).__name__ for m in listed if not isinstance(m, dict)]
                    if wrong:
                        raise TypeError(f"{returned} a {wrong[0]} among its results "
                                        f"({len(wrong)} of {len(batch)} not dicts): {expected}")
                except Exception as err:  # noqa: BLE001 - reported with each task
                    for task in batch:
                        yield task, err
                    continue
                share = (time.perf_counter() - start) / len(batch)
                for task, metrics in zip(batch, listed, strict=True):
                    yield task, run_outcome(metrics, share, vmap_batch=len(batch))

    def describe(self) -> str:
        """Where the runs went: this process, how many vmapped."""
        if self.single and not self.batched:
            return "this process, one run at a time (nothing to vmap)"
        text = f"this process, vmapped batches of up to {self.batch_size}"
        return text + (f" ({self.single} runs one at a time)" if self.single else "")


_UNGUARDED = ("worker processes are spawned and re-import the script that started the "
              "sweep, so its main code must run under `if __name__ == \"__main__\":` (or pass "
              "executor=1 to run in this process)")


def _check_importable(workload: Any) -> None:
    """ValueError where spawned workers could not import ``workload``'s class:
    one defined in an interactive ``__main__`` (a notebook, ``python -c``),
    which has no file to re-import. The pool's own error blamed a missing
    main guard, which a notebook cannot add; the real one reached only the
    worker's stderr (a Jupyter server's terminal)."""
    cls = type(workload)
    main = sys.modules.get("__main__")
    if cls.__module__ == "__main__" and getattr(main, "__file__", None) is None:
        raise ValueError(f"workload: its class {cls.__qualname__} is defined in an "
                         "interactive session (a notebook, python -c), which worker processes "
                         "cannot import; define it in a .py module, or pass executor=1 to run "
                         "in this process")


def check_not_bootstrapping(what: str) -> None:
    """RuntimeError naming the missing main guard when ``what`` is called while
    a spawned worker re-imports the script that started the sweep (as
    multiprocessing's own check, on the process's ``_inheriting`` flag)."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(f"{what} was called in a worker process as it started: "
                           f"{_UNGUARDED}")


def _init_worker(threads: int, parent_pid: int) -> None:
    """Worker start-up: cap library thread pools, exit if the sweep dies."""
    for var in _THREAD_VARS:
        os.environ[var] = str(threads)
    try:  # numpy's BLAS is loaded already: cap it at run time
        import threadpoolctl
    except ImportError:  # pragma: no cover - threadpoolctl is a base dependency
        pass
    else:
        global _LIMITS
        _LIMITS = threadpoolctl.threadpool_limits(threads)

    def watch() -> None:
        # A SIGKILL of the sweep cannot stop its workers; they stop themselves.
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="optical-parent-watch", daemon=True).start()


_LIMITS: Any = None


def _start_tracker_deaf_to_hangup() -> None:
    """Start multiprocessing's resource tracker (if it is not running yet)
    with SIGHUP blocked, which it inherits and keeps: it ignores SIGINT and
    SIGTERM, not SIGHUP, so a closed terminal (SIGHUP to the whole process
    group) killed it under a live pool, and Python printed a warning and a
    traceback per semaphore after the sweep's one line."""
    if not (hasattr(signal, "pthread_sigmask") and hasattr(signal, "SIGHUP")):
        return  # pragma: no cover - not POSIX
    from multiprocessing import resource_tracker

    before = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGHUP})
    try:  # (a SIGHUP meanwhile waits, and lands when the mask is restored)
        resource_tracker.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, before)


#: Seconds :meth:`ProcessExecutor.close` waits for its workers to exit before
#: killing them (an idle worker exits at once).
_CLOSE_WAIT_S = 10.0


def _check_cwd() -> None:
    """FileNotFoundError naming the cause where this process's working
    directory was deleted (a shell left in it): spawn gives its workers
    that directory, and failed with a bare "[Errno 2] No such file or
    directory" naming nothing."""
    if cwd_deleted():
        raise FileNotFoundError(
            errno.ENOENT, "No such file or directory (the current directory was deleted, "
            "and worker processes start in it); cd to a directory that exists", ".")


class ProcessExecutor(Executor):
    """Worker processes on this machine (``concurrent.futures``, spawn).

    Parameters
    ----------
    jobs : int, optional
        Most worker processes; default: every core available to this process.
        A call starts one per run up to ``jobs``, and each worker's BLAS/OpenMP
        pools get ``cores // workers`` threads (at least one), so the workers
        neither oversubscribe the cores nor leave them idle.
    """

    def __init__(self, jobs: int | None = None) -> None:
        self._cores = _available_cores()
        self.jobs = check_positive_int(self._cores if jobs is None else jobs, "jobs")
        self.workers = 0  # worker processes of the pool (0: none started)
        self.threads = self._threads(self.jobs)  # threads per worker of a pool of `jobs`
        self._ran = 0  # runs of the last call
        self._pool: cf.ProcessPoolExecutor | None = None

    def _threads(self, workers: int) -> int:
        return max(1, self._cores // workers)

    def _get_pool(self, runs: int) -> cf.ProcessPoolExecutor:
        workers = min(self.jobs, runs)
        if self._pool is not None and self.workers < workers:
            self.close()  # a pool of an earlier, smaller call: start a bigger one
        if self._pool is None:
            _check_cwd()
            self.workers, self.threads = workers, self._threads(workers)
            _start_tracker_deaf_to_hangup()
            self._pool = cf.ProcessPoolExecutor(
                max_workers=workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_init_worker, initargs=(self.threads, os.getpid()))
        return self._pool

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[Task, Outcome]]:
        """Run the tasks on the worker processes, yielding each as it finishes."""
        self._ran = len(tasks)  # describe() tells of this call alone
        if not tasks:
            return
        _check_importable(tasks[0].workload)
        pool = self._get_pool(len(tasks))
        todo = iter(tasks)
        window = 2 * self.workers  # few queued runs: a cancel is immediate
        running: dict[cf.Future, Task] = {}
        finished = False
        try:
            while True:
                while len(running) < window:
                    task = next(todo, None)
                    if task is None:
                        break
                    running[pool.submit(_portable, task)] = task
                if not running:
                    break
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                # Finished runs before failed ones: a failure ends the sweep,
                # and runs finished beside it are then already recorded.
                for future in sorted(done, key=lambda f: f.exception() is not None):
                    task = running.pop(future)
                    err = future.exception()
                    if isinstance(err, BrokenProcessPool):
                        cause = err.__cause__
                        why = "" if cause is None else f"; the pool's reason: {cause}"
                        err = BrokenProcessPool(
                            f"a worker process died while {len(running) + 1} runs were in "
                            f"flight, this one among them ({err}{why}); if it died as it "
                            f"started, {_UNGUARDED}")
                    yield task, (err if err is not None else future.result())
            finished = True
        finally:
            if not finished:
                self._abort()

    def _abort(self) -> None:
        pool, self._pool = self._pool, None
        if pool is None:
            return
        manager = getattr(pool, "_executor_manager_thread", None)
        terminate = getattr(pool, "terminate_workers", None)  # Python >= 3.14
        if terminate is not None:
            terminate()
        else:
            for process in list(getattr(pool, "_processes", {}).values()):
                process.terminate()
            pool.shutdown(wait=False, cancel_futures=True)
        # The manager thread, reaping the killed workers, holds the pool's
        # queues; once it is done they can be freed and their semaphores
        # unlinked (a Ctrl-C dying of SIGINT left five for Python's resource
        # tracker to warn of).
        if manager is not None:
            manager.join(_CLOSE_WAIT_S)

    def close(self) -> None:
        """Stop the workers. Never waits without a limit: a worker killed while
        the pool shuts down can leave another blocked on the call queue's lock
        forever (and the pool's manager thread waiting for it)."""
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list(getattr(pool, "_processes", {}).values())
        # Taken before shutdown, which forgets it: the manager thread reaps the
        # workers, and until it has, a dead worker's is_alive() can say True.
        manager = getattr(pool, "_executor_manager_thread", None)
        pool.shutdown(wait=False, cancel_futures=True)
        deadline = time.monotonic() + _CLOSE_WAIT_S
        for process in processes:
            process.join(max(0.0, deadline - time.monotonic()))
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(_CLOSE_WAIT_S)
        if manager is not None:
            manager.join(_CLOSE_WAIT_S)

    def describe(self) -> str:
        """Where the runs went: how many worker processes."""
        if not self._ran:
            return "no worker process (nothing to run)"
        workers = min(self.workers, self._ran)
        return f"{workers} local worker process{'es' if workers > 1 else ''}"


class DaskExecutor(Executor):
    """Runs on a Dask cluster through a ``dask.distributed.Client``.

    Every pending run is submitted at once; the scheduler places them. The
    workers need the same version of ``optical`` (a model workload also needs
    its model directory at the same path). The client is borrowed: closing
    this executor does not close it.
    """

    def __init__(self, client: Any) -> None:
        self.client = client

    def run(self, tasks: Sequence[Task]) -> Iterator[tuple[Task, Outcome]]:
        """Submit the tasks to the Dask cluster, yielding each as it finishes."""
        if not tasks:
            return
        from distributed import as_completed

        tag = uuid.uuid4().hex[:8]
        by_key: dict[str, Task] = {}
        futures = []
        try:
            for task in tasks:
                key = f"optical-run-{task.point}-{task.seed}-{task.run_id}-{tag}"
                try:
                    futures.append(self.client.submit(_portable, task, key=key, retries=0))
                except Exception as err:  # a workload Dask cannot serialise, say
                    yield task, err
                    return
                by_key[key] = task
            for future in as_completed(futures):
                task = by_key[future.key]
                try:
                    if future.status == "error":
                        outcome: Outcome = future.exception()
                    else:
                        outcome = future.result()
                        if isinstance(outcome, dict):  # a worker of an optical that
                            # did not send its versions computed results version 1
                            outcome.setdefault("results_version", 1)
                            outcome.setdefault("optical_version", "unknown (before 2026-12-06)")
                except Exception as err:  # cancelled: the scheduler is gone, say
                    outcome = RuntimeError(f"Dask returned no result ({type(err).__name__}: "
                                           f"{err}); is the scheduler still running?")
                yield task, outcome
                future.release()
        finally:
            if getattr(self.client, "status", "running") == "running":  # closed: cannot cancel
                self.client.cancel(futures)

    def describe(self) -> str:
        """Where the runs went: the cluster's scheduler and workers."""
        if getattr(self.client, "status", "running") != "running":  # closed, scheduler gone
            return f"Dask client, {self.client.status}"
        info = self.client.scheduler_info()
        workers = info.get("workers", {})
        threads = sum(int(w.get("nthreads", 1)) for w in workers.values())
        return f"Dask cluster at {self.client.scheduler.address} ({len(workers)} workers, " \
               f"{threads} threads)"


def _available_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def _is_dask_client(obj: Any) -> bool:
    return type(obj).__module__.split(".")[0] == "distributed" and hasattr(obj, "submit")


def make_executor(executor: Any) -> tuple[Executor, bool]:
    """``(executor, owned)`` from the ``executor=`` argument of a sweep.

    None: local processes on every core; an int: that many local processes
    (1: in this process); "serial" / "processes" / "vmap"; a ``dask.distributed.Client``;
    or an :class:`Executor`. ``owned``: the sweep closes it when done.
    """
    if executor is None or executor == "processes":
        return ProcessExecutor(), True
    if executor == "serial":
        return SerialExecutor(), True
    if executor == "vmap":
        return VmapExecutor(), True
    if isinstance(executor, Executor):
        return executor, False
    if isinstance(executor, int) and not isinstance(executor, bool):
        if executor < 1:
            raise ValueError(f"executor: {executor} is not a number of jobs (a positive "
                             "integer; 1 runs in this process)")
        if executor == 1:
            return SerialExecutor(), True
        return ProcessExecutor(executor), True
    if _is_dask_client(executor):
        return DaskExecutor(executor), False
    raise TypeError(f"executor: {executor!r} is not valid; expected None, a number of jobs, "
                    "'serial', 'processes', 'vmap', a dask.distributed.Client or an "
                    "optical.sweep Executor")
