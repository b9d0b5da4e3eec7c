"""GPU workers: the inference role (vLLM) and the training role (TRL), both run from the
worker image (``flowmesh_sdk/imagebuild/gpu-worker``) on an instance through the container runtime.

* :class:`InferenceWorker` -- ``join()`` plans, starts and health-checks a vLLM server and
  returns its :class:`InferenceEndpoint` (rate-limited, locality-carrying, micro-batching
  async client); ``leave()`` drains and stops it.
* :class:`ElasticWorkers` -- the control loop that follows a role's queue by renting and
  releasing workers on any GPU provider (offers ranked by the bidder's U, rent-to-ready
  lag measured, outbid workers replaced and their requests re-dispatched, drain before
  release); see :mod:`.elastic`.
* :class:`TrainingWorker` -- ``start()`` / ``wait()`` / ``stop()`` a TRL job; its
  checkpoints go to the content-addressed store (:mod:`flowmesh_sdk.cas`).

See docs/workers.md.
"""

from .batching import MicroBatcher, group_key
from .checkpoints import Checkpoint, publish_dir, read_manifest, restore_checkpoint
from .container import LABEL_WORKER, WorkerContainer, gpu_flags
from .elastic import (ElasticStats, ElasticWorker, ElasticWorkers, ScalingDecision, ScalingPolicy, ServeCommand,
                      WorkerLag)
from .endpoint import HEADER_G_LOC, HEADER_MODEL, HEADER_WORKER, Completion, DrainReport, InferenceEndpoint
from .errors import TrainingFailedError, WorkerStartError
from .health import HealthReport, wait_until_healthy
from .inference import InferenceWorker
from .specs import (CONTAINER_PORT, ChatMessage, ClientLimits, InferenceSpec, Mount, SamplingParams,
                    TrainingSpec)
from .state import WorkerState
from .training import TrainingResult, TrainingWorker, parse_train_metrics

__all__ = [
    "CONTAINER_PORT", "ChatMessage", "Checkpoint", "ClientLimits", "Completion", "DrainReport", "ElasticStats",
    "ElasticWorker", "ElasticWorkers",
    "HEADER_G_LOC", "HEADER_MODEL", "HEADER_WORKER", "HealthReport", "InferenceEndpoint",
    "InferenceSpec", "InferenceWorker", "LABEL_WORKER", "MicroBatcher", "Mount", "SamplingParams",
    "ScalingDecision", "ScalingPolicy", "ServeCommand", "TrainingFailedError", "TrainingResult",
    "TrainingSpec", "TrainingWorker", "WorkerContainer", "WorkerLag", "WorkerStartError", "WorkerState", "gpu_flags", "group_key", "parse_train_metrics", "publish_dir",
    "read_manifest", "restore_checkpoint", "wait_until_healthy",
]
