"""Typed, validated records of the GPU worker roles (inference and training).

Every record checks its fields when it is built and raises
:class:`~flowmesh_sdk.errors.SpecError` naming the field and what is allowed, like the
core records in :mod:`flowmesh_sdk.specs`.  ``env`` mappings are read-only copies kept
out of ``repr`` (they may hold a Hugging Face token).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, cast

from ..errors import SpecError
from ..specs import check_choice, check_number, frozen_env

#: the port the worker image's server listens on inside the container
#: (flowmesh_sdk/imagebuild/gpu-worker/Containerfile: ``EXPOSE 8000``; entrypoint.py ``DEFAULT_PORT``)
CONTAINER_PORT = 8000
#: train --recipe values the worker image's entrypoint accepts (entrypoint.py ``RECIPES``)
RECIPES = ("sft", "dpo", "grpo")
CHAT_ROLES = ("system", "user", "assistant", "tool")
_GPUS = re.compile(r"(all|none|[0-9]+(,[0-9]+)*)", re.ASCII)
_BAD_PATH_CHARS = (":", ",", "\n", "\x00")


def check_gpus(field_name: str, value: object) -> str:
    """``all``, ``none`` or a comma list of GPU indices such as ``0,1``."""
    if not isinstance(value, str) or not _GPUS.fullmatch(value):
        raise SpecError(field_name, f"must be 'all', 'none' or GPU indices like '0,1'; got {value!r}")
    return value


def _check_path(field_name: str, value: object) -> None:
    if not isinstance(value, str) or not value.startswith("/") or any(c in value for c in _BAD_PATH_CHARS):
        raise SpecError(field_name, f"must be an absolute path without ':' or ','; got {value!r}")


def _check_text(field_name: str, value: object) -> None:
    if not isinstance(value, str) or not value.strip():
        raise SpecError(field_name, f"must be a non-empty string; got {value!r}")


def _check_args(field_name: str, value: object) -> tuple[str, ...]:
    items = () if isinstance(value, str) else tuple(cast("Iterable[object]", value))  # not iterable: TypeError
    args = tuple(a for a in items if isinstance(a, str))
    if isinstance(value, str) or len(args) != len(items):
        raise SpecError(field_name, f"must be a list of strings (one per argument); got {value!r}")
    return args


@dataclass(frozen=True, slots=True)
class Mount:
    """A directory of the instance seen inside the worker container (``-v SOURCE:TARGET``)."""

    source: str
    target: str
    read_only: bool = True

    def __post_init__(self) -> None:
        _check_path("mount.source", self.source)
        _check_path("mount.target", self.target)
        if not isinstance(self.read_only, bool):
            raise SpecError("mount.read_only", f"must be true or false; got {self.read_only!r}")

    def flag(self) -> str:
        return f"{self.source}:{self.target}:{'ro' if self.read_only else 'rw'}"


@dataclass(frozen=True, slots=True)
class InferenceSpec:
    """One vLLM server (``entrypoint.py serve``) in the worker image on one instance.

    ``tensor_parallel`` None lets the container choose: the largest power of two that
    is at most the GPUs it sees and divides ``num_heads`` (the model's
    ``num_attention_heads``; give it, or the size need not divide the heads).
    ``gpus``: ``all``, ``none`` (no device passed; a CPU test) or indices ``0,1``.
    The server's port 8000 is published on ``publish_host`` (loopback by default: vLLM's
    API has no authentication unless you give it ``--api-key``); clients use
    ``url_host`` (default ``publish_host``).  ``start_timeout_s`` bounds loading the
    weights and passing the health check; ``extra_args`` go to ``vllm serve`` unchanged.
    """

    model: str
    image: str
    num_heads: int | None = None
    served_model_name: str | None = None
    tensor_parallel: int | None = None
    gpus: str = "all"
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    publish_host: str = "127.0.0.1"
    url_host: str | None = None
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    extra_args: tuple[str, ...] = ()
    start_timeout_s: float = 1800.0
    ipc_host: bool = True

    def __post_init__(self) -> None:
        _check_text("inference.model", self.model)
        _check_text("inference.image", self.image)
        if self.num_heads is not None:
            check_number("inference.num_heads", self.num_heads, lo=1, integer=True)
        if self.served_model_name is not None:
            _check_text("inference.served_model_name", self.served_model_name)
        if self.tensor_parallel is not None:
            check_number("inference.tensor_parallel", self.tensor_parallel, lo=1, hi=64, integer=True)
            if self.num_heads is not None and self.num_heads % self.tensor_parallel:
                raise SpecError("inference.tensor_parallel",
                                f"{self.tensor_parallel} does not divide num_heads {self.num_heads}")
        check_gpus("inference.gpus", self.gpus)
        if self.max_model_len is not None:
            check_number("inference.max_model_len", self.max_model_len, lo=1, integer=True)
        if self.gpu_memory_utilization is not None:
            check_number("inference.gpu_memory_utilization", self.gpu_memory_utilization,
                         lo=0, hi=1, lo_open=True)
        _check_text("inference.publish_host", self.publish_host)
        if self.url_host is not None:
            _check_text("inference.url_host", self.url_host)
        if not all(isinstance(m, Mount) for m in self.mounts):
            raise SpecError("inference.mounts", "must be a list of Mount records")
        object.__setattr__(self, "mounts", tuple(self.mounts))
        object.__setattr__(self, "env", frozen_env("inference.env", self.env))
        object.__setattr__(self, "extra_args", _check_args("inference.extra_args", self.extra_args))
        check_number("inference.start_timeout_s", self.start_timeout_s, lo=0, lo_open=True)
        if not isinstance(self.ipc_host, bool):
            raise SpecError("inference.ipc_host", f"must be true or false; got {self.ipc_host!r}")

    @property
    def name_in_api(self) -> str:
        """The model name clients send (``--served-model-name``, else the model)."""
        return self.served_model_name or self.model

    def serve_args(self) -> list[str]:
        """The arguments of ``entrypoint.py serve`` (the image's ENTRYPOINT)."""
        args = ["serve", "--model", self.model, "--port", str(CONTAINER_PORT)]
        if self.tensor_parallel is None:
            args += ["--tensor-parallel", "auto", "--tensor-parallel-fit"]
        else:
            args += ["--tensor-parallel", str(self.tensor_parallel)]
        if self.num_heads is not None:
            args += ["--num-heads", str(self.num_heads)]
        if self.max_model_len is not None:
            args += ["--max-model-len", str(self.max_model_len)]
        if self.gpu_memory_utilization is not None:
            args += ["--gpu-memory-utilization", repr(self.gpu_memory_utilization)]
        if self.served_model_name is not None:
            args += ["--served-model-name", self.served_model_name]
        return args


@dataclass(frozen=True, slots=True)
class TrainingSpec:
    """One TRL job (``entrypoint.py train``): ``recipe`` sft, dpo or grpo.

    ``model``, ``dataset`` and ``output`` are paths on the instance (``model`` may also
    be a Hub id); in a container they are mounted at the same paths (model and dataset
    read-only).  ``image`` set: the job runs in that worker image through the container
    runtime; None: the runner runs ``python entrypoint.py train`` on the machine itself
    (TRL installed there; the bench does this).  ``num_processes`` None = one per
    visible GPU.  ``extra_args`` go to the TRL script unchanged (``--per_device_train_batch_size 4``).
    """

    recipe: str
    model: str
    dataset: str
    output: str
    image: str | None = None
    max_steps: int | None = None
    num_processes: int | None = None
    reward_funcs: tuple[str, ...] = ()
    use_vllm: bool = False
    gpus: str = "all"
    mounts: tuple[Mount, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict, repr=False)
    extra_args: tuple[str, ...] = ()
    timeout_s: float = 86400.0
    python: str = "python3"
    entrypoint: str | None = None

    def __post_init__(self) -> None:
        check_choice("training.recipe", self.recipe, RECIPES)
        _check_text("training.model", self.model)
        _check_path("training.dataset", self.dataset)
        _check_path("training.output", self.output)
        if self.image is not None:
            _check_text("training.image", self.image)
        if self.max_steps is not None:
            check_number("training.max_steps", self.max_steps, lo=1, integer=True)
        if self.num_processes is not None:
            check_number("training.num_processes", self.num_processes, lo=1, hi=64, integer=True)
        object.__setattr__(self, "reward_funcs", _check_args("training.reward_funcs", self.reward_funcs))
        if self.recipe == "grpo" and not self.reward_funcs:
            raise SpecError("training.reward_funcs", "required with recipe grpo (e.g. ['accuracy_reward'])")
        if self.recipe != "grpo" and (self.reward_funcs or self.use_vllm):
            raise SpecError("training.reward_funcs" if self.reward_funcs else "training.use_vllm",
                            f"only allowed with recipe grpo, not {self.recipe}")
        check_gpus("training.gpus", self.gpus)
        if not all(isinstance(m, Mount) for m in self.mounts):
            raise SpecError("training.mounts", "must be a list of Mount records")
        object.__setattr__(self, "mounts", tuple(self.mounts))
        object.__setattr__(self, "env", frozen_env("training.env", self.env))
        object.__setattr__(self, "extra_args", _check_args("training.extra_args", self.extra_args))
        check_number("training.timeout_s", self.timeout_s, lo=0, lo_open=True)
        _check_text("training.python", self.python)
        if self.entrypoint is not None:
            _check_path("training.entrypoint", self.entrypoint)

    def train_args(self) -> list[str]:
        """The arguments of ``entrypoint.py train``."""
        args = ["train", "--recipe", self.recipe, "--model", self.model, "--dataset", self.dataset,
                "--output", self.output,
                "--num-processes", "auto" if self.num_processes is None else str(self.num_processes)]
        if self.max_steps is not None:
            args += ["--max-steps", str(self.max_steps)]
        if self.reward_funcs:
            args += ["--reward-funcs", *self.reward_funcs]
        if self.use_vllm:
            args.append("--use-vllm")
        return args


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """OpenAI-style sampling parameters; requests with equal ones (and the same model) may
    share one micro-batch."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def __post_init__(self) -> None:
        check_number("sampling.max_tokens", self.max_tokens, lo=1, integer=True)
        check_number("sampling.temperature", self.temperature, lo=0, hi=100)
        check_number("sampling.top_p", self.top_p, lo=0, hi=1, lo_open=True)
        check_number("sampling.n", self.n, lo=1, hi=128, integer=True)
        object.__setattr__(self, "stop", _check_args("sampling.stop", self.stop))
        if self.seed is not None:
            check_number("sampling.seed", self.seed, lo=0, integer=True)

    def payload(self) -> dict[str, Any]:
        """The request fields (what the group key is computed from)."""
        body: dict[str, Any] = {"max_tokens": self.max_tokens, "temperature": float(self.temperature),
                                "top_p": float(self.top_p), "n": self.n}
        if self.stop:
            body["stop"] = list(self.stop)
        if self.seed is not None:
            body["seed"] = self.seed
        return body


@dataclass(frozen=True, slots=True)
class ChatMessage:
    """One message of a conversation."""

    role: str
    content: str

    def __post_init__(self) -> None:
        check_choice("chat.role", self.role, CHAT_ROLES)
        if not isinstance(self.content, str):
            raise SpecError("chat.content", f"must be a string; got {type(self.content).__name__}")


@dataclass(frozen=True, slots=True)
class ClientLimits:
    """How an :class:`~flowmesh_sdk.workers.InferenceEndpoint` talks to its worker.

    ``rate_per_s`` / ``burst``: the token bucket each call passes (the first tier of the
    three-tier control); ``max_batch`` / ``max_batch_wait_s``: completions with the same
    model and sampling parameters wait at most that long to share one request of at most
    that many prompts (``max_batch=1`` turns batching off); ``request_timeout_s``: the
    deadline of one call, rate-limit wait included.
    """

    rate_per_s: float = 100.0
    burst: int = 100
    max_batch: int = 32
    max_batch_wait_s: float = 0.005
    request_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        check_number("limits.rate_per_s", self.rate_per_s, lo=0, lo_open=True)
        check_number("limits.burst", self.burst, lo=1, integer=True)
        check_number("limits.max_batch", self.max_batch, lo=1, hi=4096, integer=True)
        check_number("limits.max_batch_wait_s", self.max_batch_wait_s, lo=0, hi=60)
        check_number("limits.request_timeout_s", self.request_timeout_s, lo=0, lo_open=True)
