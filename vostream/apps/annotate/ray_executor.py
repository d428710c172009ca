"""``vostream annotate --ray``: the batch on a Ray cluster.  One actor per worker slot holds a loaded tracker;
each video is one actor method call (one in flight per actor).  Same executor interface as
:class:`~vostream.apps.annotate.local_executor.LocalExecutor`; same outputs (the actors write into ``--out``, which must
be a path every node sees).

Ray is optional and imported lazily (:func:`import_ray` raises :class:`ConfigError` with the install command).
With no address, :func:`start_local_ray` starts a local Ray on 127.0.0.1 only, without the dashboard.  Driven from
one thread; not thread-safe.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Protocol

from vostream.apps.annotate.job import JobResult, JobResultRecord, JobRunner, TrackOptions, VideoJob
from vostream.apps.annotate.local_executor import Event
from vostream.pipeline.errors import BackendError, ConfigError

if TYPE_CHECKING:  # Ray is optional and untyped here (pyproject: follow_imports = "skip")
    from ray import ObjectRef
    from ray.actor import ActorHandle

logger = logging.getLogger(__name__)


class _ActorFactory(Protocol):
    """``ray.remote(AnnotateActor).options(...)``: what :class:`RayExecutor` calls to start an actor."""

    def remote(self, options: TrackOptions, name: str) -> ActorHandle: ...


def import_ray() -> ModuleType:
    try:
        import ray
    except ImportError as exc:
        raise ConfigError(
            "--ray needs Ray, which is not installed: pip install 'vostream[ray]' (or pip install ray)"
        ) from exc
    return ray


def start_local_ray(num_cpus: int, num_gpus: float | None = None) -> ModuleType:
    """Start a local Ray bound to 127.0.0.1 (no dashboard, small object store); returns the ``ray`` module."""
    ray = import_ray()
    kwargs: dict[str, object] = dict(
        num_cpus=max(1, num_cpus),
        include_dashboard=False,
        log_to_driver=False,
        _node_ip_address="127.0.0.1",
        object_store_memory=200 * 1024 * 1024,
        configure_logging=False,
    )
    if num_gpus is not None:
        kwargs["num_gpus"] = num_gpus
    try:
        ray.init(**kwargs)
    except Exception as exc:  # noqa: BLE001 - Ray raises many types; one clear line
        raise BackendError(f"cannot start a local Ray: {type(exc).__name__}: {exc}") from exc
    return ray


class AnnotateActor:
    """The body of a Ray actor (wrapped with ``ray.remote`` at run time): one loaded tracker, one video at a time.
    ``max_concurrency=2`` lets :meth:`progress` answer while :meth:`run` works."""

    def __init__(self, options: TrackOptions, name: str) -> None:
        import socket

        self.runner = JobRunner(options, worker=f"{name} on {socket.gethostname()}")
        self._key: str | None = None
        self._frames = 0
        self._cancel = False

    def ready(self) -> str:
        return self.runner.worker

    def run(self, job: VideoJob) -> JobResultRecord:
        self._key, self._frames, self._cancel = job.key, 0, False
        try:
            return self.runner.run(job, self._progress).to_dict()
        finally:
            self._key = None

    def _progress(self, frames: int) -> bool:
        self._frames = frames
        return not self._cancel

    def progress(self) -> tuple[str | None, int]:
        return self._key, self._frames

    def cancel(self) -> None:
        self._cancel = True


@dataclass
class _Slot:
    actor: ActorHandle
    ready_ref: ObjectRef
    ready: bool = False
    job: VideoJob | None = None
    run_ref: ObjectRef | None = None
    progress_ref: ObjectRef | None = None


class RayExecutor:
    """``slots`` Ray actors.  ``address=None`` starts a local Ray (shut down in :meth:`close`); when Ray is already
    initialised in this process, that session is used and left running."""

    def __init__(
        self,
        options: TrackOptions,
        slots: int,
        address: str | None = None,
        num_gpus: float = 0.0,
        resources: dict[str, float] | None = None,
    ) -> None:
        self.options = options
        self.slots = slots
        self.address = address
        self.num_gpus = num_gpus
        self.resources = dict(resources or {})
        self._ray: ModuleType | None = None
        self._own_ray = False
        self._cls: _ActorFactory | None = None
        self._slots: dict[int, _Slot] = {}
        self._closed = False

    def start(self) -> None:
        ray = import_ray()
        if not ray.is_initialized():
            if self.address is None:
                start_local_ray(self.slots)
            else:
                try:
                    ray.init(address=self.address, log_to_driver=False, configure_logging=False)
                except Exception as exc:  # noqa: BLE001
                    raise BackendError(
                        f"cannot connect to the Ray cluster at {self.address!r}: "
                        f"{type(exc).__name__}: {exc}; check the address (host:port of the head "
                        f"node's GCS) and that the cluster runs"
                    ) from exc
            self._own_ray = True
        self._ray = ray
        actor_options: dict[str, object] = dict(
            num_cpus=1, num_gpus=self.num_gpus, max_concurrency=2, max_restarts=0, max_task_retries=0
        )
        if self.resources:
            actor_options["resources"] = self.resources
        # NumPy's BLAS/OpenMP pools sized like the actor's OpenCV threads (read when the actor imports NumPy)
        env = {k: v for k, v in self.options.thread_env().items() if k not in os.environ}
        if env:
            actor_options["runtime_env"] = {"env_vars": env}
        self._cls = ray.remote(AnnotateActor).options(**actor_options)
        for slot in range(self.slots):
            self._new_actor(slot)

    @property
    def ray(self) -> ModuleType:
        """The ``ray`` module once :meth:`start` ran."""
        if self._ray is None:
            raise BackendError("the Ray executor is not started: call start() first")
        return self._ray

    def _new_actor(self, slot: int) -> None:
        assert self._cls is not None, "start() first"
        actor = self._cls.remote(self.options, f"ray actor {slot}")
        self._slots[slot] = _Slot(actor, actor.ready.remote())

    def idle(self) -> list[int]:
        return [i for i, s in self._slots.items() if s.ready and s.job is None]

    def submit(self, slot: int, job: VideoJob) -> None:
        s = self._slots[slot]
        s.job = job
        s.run_ref = s.actor.run.remote(job)

    def poll(self, timeout: float) -> list[Event]:
        ray = self.ray
        out: list[Event] = []
        for s in self._slots.values():
            if s.job is not None and s.progress_ref is None:
                s.progress_ref = s.actor.progress.remote()
        refs: dict[ObjectRef, tuple[int, str]] = {}
        for i, s in self._slots.items():
            for kind, ref in (
                ("ready", s.ready_ref if not s.ready else None),
                ("run", s.run_ref),
                ("progress", s.progress_ref),
            ):
                if ref is not None:
                    refs[ref] = (i, kind)
        if not refs:
            time.sleep(timeout)
            return out
        done, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout)
        for ref in done:
            slot, kind = refs[ref]
            s = self._slots[slot]
            try:
                value = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - actor death, task error: mapped below
                out += self._failure(slot, kind, exc)
                continue
            if kind == "ready":
                s.ready = True
                logger.info("Ray slot %d ready: %s", slot, value)
                out.append(Event("ready", slot))
            elif kind == "progress":
                s.progress_ref = None
                if s.job is not None and value[0] == s.job.key:
                    out.append(Event("frames", slot, s.job.key, int(value[1])))
            else:
                result = JobResult.from_dict(value)
                s.job, s.run_ref, s.progress_ref = None, None, None
                out.append(Event("result", slot, result.key, result.frames, result))
        return out

    def _failure(self, slot: int, kind: str, exc: BaseException) -> list[Event]:
        s = self._slots[slot]
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if kind == "ready":
            return [Event("fatal", slot, error=f"Ray actor {slot} cannot load the tracker: {text}")]
        if kind == "progress" and s.run_ref is not None:
            s.progress_ref = None  # the run ref reports the actor's death
            return []
        events = []
        if s.job is not None:
            events.append(
                Event(
                    "result",
                    slot,
                    s.job.key,
                    0,
                    JobResult(
                        s.job.key,
                        "failed",
                        error=f"Ray actor {slot} failed while annotating this video: "
                        f"{type(exc).__name__}: {text}",
                        worker=f"ray actor {slot}",
                    ),
                )
            )
        logger.warning("Ray actor %d failed (%s); starting a new one", slot, text)
        try:
            self.ray.kill(s.actor)
        except Exception:  # noqa: BLE001 - already gone
            pass
        self._new_actor(slot)
        return events

    def abandon(self) -> None:
        for s in self._slots.values():
            if s.job is not None:
                try:
                    self.ray.kill(s.actor)
                except Exception:  # noqa: BLE001
                    pass
                s.job = None

    def close(self) -> None:
        if self._closed or self._ray is None:
            return
        self._closed = True
        for s in self._slots.values():
            try:
                self._ray.kill(s.actor)
            except Exception:  # noqa: BLE001
                pass
        if self._own_ray:
            self._ray.shutdown()


__all__ = ["AnnotateActor", "RayExecutor", "import_ray", "start_local_ray"]
