"""Annotation keys, resource names and constants shared with HAMi (byte-compatible)."""

from __future__ import annotations

from typing import Final

# Pod annotations written by the scheduler side (accounting is their only writer in numafit).
TO_ALLOCATE: Final = "hami.io/vgpu-devices-to-allocate"
ALLOCATED: Final = "hami.io/vgpu-devices-allocated"
VGPU_NODE: Final = "hami.io/vgpu-node"
VGPU_TIME: Final = "hami.io/vgpu-time"
BIND_PHASE: Final = "hami.io/bind-phase"
BIND_TIME: Final = "hami.io/bind-time"
SCHEDULER_OWNED: Final = (VGPU_NODE, BIND_TIME, BIND_PHASE, TO_ALLOCATE, ALLOCATED, VGPU_TIME)
WRITE_FENCE: Final = "numafit.io/write-fence"
"""numafit's own: written by accounting at the resourceVersion of a write whose answer did not
come in time, so that the late write can never land (its precondition then fails)."""

# Pod annotations set by users.
NUMA_ALIGNMENT: Final = "hami.io/numa-alignment"
NUMA_BIND: Final = "nvidia.com/numa-bind"
USE_UUID: Final = "nvidia.com/use-gpuuuid"
NOUSE_UUID: Final = "nvidia.com/nouse-gpuuuid"
USE_TYPE: Final = "nvidia.com/use-gputype"
NOUSE_TYPE: Final = "nvidia.com/nouse-gputype"
VGPU_MODE: Final = "nvidia.com/vgpu-mode"
GPU_POLICY: Final = "hami.io/gpu-scheduler-policy"
NODE_POLICY: Final = "hami.io/node-scheduler-policy"
SCORING_WEIGHTS: Final = "hami.io/device-scoring-weights"

# Node annotations.
NODE_REGISTER: Final = "hami.io/node-nvidia-register"
DEVICE_CORDON: Final = "hami.io/device-cordon"
NODE_LOCK: Final = "hami.io/mutex.lock"

# Vendor keys HAMi registers; only NVIDIA takes part in the NUMA refit.
NVIDIA: Final = "NVIDIA"
KNOWN_VENDORS: Final = frozenset(
    {
        "NVIDIA",
        "MLU",
        "DCU",
        "Iluvatar",
        "Ascend",
        "Metax",
        "MetaxSGPU",
        "Mthreads",
        "Enflame",
        "Kunlun",
        "AWSNeuron",
    }
)

# Limits and defaults of the refit protocol (reference (i)).
MAX_ALLOWED_UUIDS: Final = 512
DEFAULT_REFIT_TIMEOUT_MS: Final = 2000
DEFAULT_SPLIT_COUNT: Final = 10
SCORE_WEIGHT_FACTOR: Final = 10
PERCENT_UNSET: Final = 101
INT32_MAX: Final = 2**31 - 1

# Bind phases.
PHASE_ALLOCATING: Final = "allocating"
PHASE_SUCCESS: Final = "success"
PHASE_FAILED: Final = "failed"
