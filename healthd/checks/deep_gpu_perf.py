"""GPU matmul throughput and host<->device copy bandwidth, measured with the node's own
PyTorch (or CuPy) through a configured Python interpreter.

The interpreter runs a small script (`SCRIPT`, passed with `-c`) that prints one JSON line:

    {"framework": "torch", "framework_version": "2.4.1", "dtype": "bfloat16", "matmul_n": 8192,
     "copy_mib": 256, "error": null,
     "gpus": [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "matmul_tflops": 712.4,
               "h2d_gbps": 53.2, "d2h_gbps": 52.9}, ...]}

`error` is "no_framework" when neither torch nor cupy imports and "no_gpu" when the
framework sees no CUDA device (both NOT_APPLICABLE); anything else is the exception the
script caught (UNKNOWN). GPU indexes follow PCI bus order (the script sets
CUDA_DEVICE_ORDER=PCI_BUS_ID before CUDA starts), the order NVML and nvidia-smi use.
Throughput is 2*n^3 flops per matmul over CUDA-event time; copies are from pinned memory.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from healthd.checks.base import (
    Check,
    CheckContext,
    Fault,
    Result,
    Status,
    Tier,
    bounds,
    not_applicable,
    ok,
    register,
    setting,
)
from healthd.checks.deep_common import (
    DEFAULT_SEARCH_DIRS,
    DeepToolConfig,
    command_failed,
    deep_fault,
    find_tool,
    run_evidence,
    threshold_for,
    tool_absent,
)
from medic_core.proc import CommandResult

NAME = "deep_gpu_perf"

# Floors for the default dtype (bfloat16) and size (8192): about half of the datasheet's
# dense BF16 peak (H100 SXM5 989 TFLOPS, A100 SXM4 312 TFLOPS), and copy floors below what
# pinned copies reach on PCIe Gen5 x16 (about 50-55 GB/s) and Gen4 x16 (24-26 GB/s, DCGM's
# own PCIe test on A100). See docs/deep-checks.md.
DEFAULT_MIN_MATMUL_TFLOPS: Mapping[str, float] = {
    "NVIDIA H100 80GB HBM3": 500.0,
    "NVIDIA A100-SXM4-80GB": 180.0,
}
DEFAULT_MIN_COPY_GBPS: Mapping[str, float] = {
    "NVIDIA H100 80GB HBM3": 40.0,
    "NVIDIA A100-SXM4-80GB": 20.0,
}

NOT_APPLICABLE_ERRORS = {
    "no_framework": "neither torch nor cupy imports",
    "no_gpu": "the framework sees no CUDA device",
}

SCRIPT = r"""
import json, os, sys, traceback
os.environ.setdefault("CUDA_DEVICE_ORDER", "PCI_BUS_ID")
N, ITERS, COPY_MIB, DTYPE = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
COPIES = 5
out = {"framework": None, "framework_version": None, "dtype": DTYPE, "matmul_n": N,
       "copy_mib": COPY_MIB, "error": None, "gpus": []}

def emit():
    print(json.dumps(out), flush=True)

def with_torch(torch):
    out["framework"], out["framework_version"] = "torch", torch.__version__
    if not torch.cuda.is_available():
        out["error"] = "no_gpu"
        return
    dtype, nbytes = getattr(torch, DTYPE), COPY_MIB << 20
    for i in range(torch.cuda.device_count()):
        dev = torch.device("cuda", i)
        torch.cuda.set_device(dev)
        a = torch.randn(N, N, device=dev, dtype=dtype)
        b = torch.randn(N, N, device=dev, dtype=dtype)
        for _ in range(3):
            torch.matmul(a, b)
        torch.cuda.synchronize(dev)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(ITERS):
            torch.matmul(a, b)
        end.record()
        torch.cuda.synchronize(dev)
        tflops = 2 * N ** 3 * ITERS / (start.elapsed_time(end) / 1e3) / 1e12
        del a, b
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        device = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        device.copy_(host, non_blocking=True)
        torch.cuda.synchronize(dev)

        def timed(dst, src):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(COPIES):
                dst.copy_(src, non_blocking=True)
            e.record()
            torch.cuda.synchronize(dev)
            return COPIES * nbytes / (s.elapsed_time(e) / 1e3) / 1e9

        h2d, d2h = timed(device, host), timed(host, device)
        out["gpus"].append({"index": i, "name": torch.cuda.get_device_name(i),
                            "matmul_tflops": round(tflops, 2), "h2d_gbps": round(h2d, 2),
                            "d2h_gbps": round(d2h, 2)})
        del host, device
        torch.cuda.empty_cache()

def with_cupy(cp):
    import numpy as np
    out["framework"], out["framework_version"] = "cupy", cp.__version__
    try:
        count = cp.cuda.runtime.getDeviceCount()
    except cp.cuda.runtime.CUDARuntimeError:
        count = 0
    if count == 0:
        out["error"] = "no_gpu"
        return
    if DTYPE == "bfloat16":
        out["dtype"] = "float16"  # cupy has no bfloat16
    dtype, nbytes = getattr(cp, out["dtype"]), COPY_MIB << 20
    for i in range(count):
        with cp.cuda.Device(i) as dev:
            a = cp.random.standard_normal((N, N), dtype=cp.float32).astype(dtype)
            b = cp.random.standard_normal((N, N), dtype=cp.float32).astype(dtype)
            for _ in range(3):
                cp.matmul(a, b)
            dev.synchronize()
            start, end = cp.cuda.Event(), cp.cuda.Event()
            start.record()
            for _ in range(ITERS):
                cp.matmul(a, b)
            end.record()
            end.synchronize()
            tflops = 2 * N ** 3 * ITERS / (cp.cuda.get_elapsed_time(start, end) / 1e3) / 1e12
            del a, b
            pinned = cp.cuda.alloc_pinned_memory(nbytes)
            host = np.frombuffer(pinned, dtype=np.uint8, count=nbytes)
            device = cp.empty(nbytes, dtype=cp.uint8)
            device.set(host)

            def timed(copy):
                s, e = cp.cuda.Event(), cp.cuda.Event()
                s.record()
                for _ in range(COPIES):
                    copy()
                e.record()
                e.synchronize()
                return COPIES * nbytes / (cp.cuda.get_elapsed_time(s, e) / 1e3) / 1e9

            h2d = timed(lambda: device.set(host))
            d2h = timed(lambda: device.get(out=host))
            name = cp.cuda.runtime.getDeviceProperties(i)["name"]
            name = name.decode() if isinstance(name, bytes) else name
            out["gpus"].append({"index": i, "name": name,
                                "matmul_tflops": round(tflops, 2), "h2d_gbps": round(h2d, 2),
                                "d2h_gbps": round(d2h, 2)})
            del host, device, pinned
            cp.get_default_memory_pool().free_all_blocks()

try:
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        with_torch(torch)
    else:
        try:
            import cupy
        except ImportError:
            out["error"] = "no_framework"
        else:
            with_cupy(cupy)
except Exception as exc:
    traceback.print_exc()
    out["error"] = f"{type(exc).__name__}: {exc}"
emit()
"""


@dataclass(frozen=True, kw_only=True)
class DeepGpuPerfConfig(DeepToolConfig):
    search_dirs: tuple[str, ...] = setting(
        ("/opt/conda/bin", *DEFAULT_SEARCH_DIRS),
        doc="absolute directories searched, in order, for the interpreter",
    )
    interpreter_names: tuple[str, ...] = setting(
        ("python3",), doc="interpreter names to look for; it must import torch or cupy"
    )
    matmul_n: int = setting(8192, minimum=256, doc="square matrix size")
    matmul_iterations: int = setting(50, minimum=1, doc="timed matmuls per GPU")
    matmul_dtype: str = setting(
        "bfloat16", choices=("bfloat16", "float16", "float32"), doc="matmul element type"
    )
    copy_mib: int = setting(256, minimum=1, doc="MiB per host<->device copy")
    command_timeout: float = setting(
        600.0, minimum=1, doc="seconds the script may run before it is killed"
    )
    min_matmul_tflops: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MIN_MATMUL_TFLOPS),
        metadata=bounds(
            minimum=0,
            doc="matmul floor (TFLOPS) by GPU model, for matmul_dtype; merged over the "
            "defaults; 0 = no floor",
        ),
    )
    default_min_matmul_tflops: float = setting(
        0.0, minimum=0, doc="matmul floor for GPU models not listed; 0 = none"
    )
    min_copy_gbps: dict[str, float] = field(
        default_factory=lambda: dict(DEFAULT_MIN_COPY_GBPS),
        metadata=bounds(
            minimum=0,
            doc="host->device and device->host floor (GB/s) by GPU model; merged over the "
            "defaults; 0 = no floor",
        ),
    )
    default_min_copy_gbps: float = setting(
        0.0, minimum=0, doc="copy floor for GPU models not listed; 0 = none"
    )

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "min_matmul_tflops", {**DEFAULT_MIN_MATMUL_TFLOPS, **self.min_matmul_tflops}
        )
        object.__setattr__(self, "min_copy_gbps", {**DEFAULT_MIN_COPY_GBPS, **self.min_copy_gbps})


@dataclass(frozen=True)
class GpuPerf:
    index: int
    name: str
    matmul_tflops: float
    h2d_gbps: float
    d2h_gbps: float

    @property
    def target(self) -> str:
        return str(self.index)


@dataclass(frozen=True)
class GpuPerfReport:
    framework: str | None
    framework_version: str | None
    dtype: str | None
    matmul_n: int | None
    error: str | None
    gpus: tuple[GpuPerf, ...]


@dataclass(frozen=True)
class DeepGpuPerfObservation:
    interpreter: str | None
    run: CommandResult | None = None
    report: GpuPerfReport | None = None
    parse_error: str | None = None


def parse_gpu_perf(text: str) -> GpuPerfReport:
    """The script's output -> GpuPerfReport: the last line that is a JSON object (a
    framework may print warnings first). Raises ValueError when there is none."""
    for line in reversed(text.strip().splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        doc: Any = json.loads(line)
        if not isinstance(doc, dict) or "gpus" not in doc:
            continue
        gpus = tuple(
            GpuPerf(
                int(g["index"]),
                str(g["name"]),
                float(g["matmul_tflops"]),
                float(g["h2d_gbps"]),
                float(g["d2h_gbps"]),
            )
            for g in doc["gpus"]
        )
        n = doc.get("matmul_n")
        return GpuPerfReport(
            doc.get("framework"),
            doc.get("framework_version"),
            doc.get("dtype"),
            None if n is None else int(n),
            doc.get("error"),
            gpus,
        )
    raise ValueError("no JSON result line in the script's output")


@register(
    name=NAME,
    tiers=(Tier.DEEP,),
    interval=86400,
    timeout=900,
    needs=("host", "commands"),
    faults={
        "gpu.perf.matmul": Fault(
            Status.CRITICAL, "matmul TFLOPS below the floor for the GPU model", "drain"
        ),
        "gpu.pcie.h2d_bw": Fault(
            Status.CRITICAL, "host-to-device copy GB/s below the floor", "drain"
        ),
        "gpu.pcie.d2h_bw": Fault(
            Status.CRITICAL, "device-to-host copy GB/s below the floor", "drain"
        ),
        "check.command_failed": Fault(
            Status.UNKNOWN, "the tool failed, timed out or printed nothing parseable"
        ),
    },
)
class DeepGpuPerfCheck(Check[DeepGpuPerfObservation, DeepGpuPerfConfig]):
    """GPU matmul TFLOPS and host<->device copy GB/s per GPU (the node's PyTorch or CuPy)."""

    config_type = DeepGpuPerfConfig

    def gather(self, ctx: CheckContext, cfg: DeepGpuPerfConfig) -> DeepGpuPerfObservation:
        interpreter = find_tool(cfg.interpreter_names, cfg.search_dirs)
        if interpreter is None:
            return DeepGpuPerfObservation(None)
        argv = [
            interpreter,
            "-c",
            SCRIPT,
            str(cfg.matmul_n),
            str(cfg.matmul_iterations),
            str(cfg.copy_mib),
            cfg.matmul_dtype,
        ]
        run = ctx.commands(argv, timeout=cfg.command_timeout)
        if run.timed_out or run.start_error:
            return DeepGpuPerfObservation(interpreter, run)
        try:
            return DeepGpuPerfObservation(interpreter, run, parse_gpu_perf(run.stdout))
        except (ValueError, KeyError, TypeError) as exc:
            return DeepGpuPerfObservation(interpreter, run, parse_error=str(exc))

    @staticmethod
    def evaluate(observation: DeepGpuPerfObservation, cfg: DeepGpuPerfConfig) -> list[Result]:
        if observation.interpreter is None:
            return [tool_absent(NAME, " or ".join(cfg.interpreter_names), cfg.search_dirs)]
        report = observation.report
        if report is None:
            return [
                command_failed(
                    NAME, "GPU benchmark script", observation.run, observation.parse_error
                )
            ]
        if report.error in NOT_APPLICABLE_ERRORS:
            return [
                not_applicable(
                    NAME,
                    f"{observation.interpreter}: {NOT_APPLICABLE_ERRORS[report.error]}",
                    {"interpreter": observation.interpreter, "framework": report.framework},
                )
            ]
        if report.error or not report.gpus:
            why = report.error or "the script measured no GPU"
            return [command_failed(NAME, "GPU benchmark script", observation.run, why)]
        base = {
            "framework": report.framework,
            "framework_version": report.framework_version,
            "dtype": report.dtype,
            "matmul_n": report.matmul_n,
            **run_evidence(observation.run),
        }
        results: list[Result] = []
        for gpu in sorted(report.gpus, key=lambda g: g.index):
            results.extend(_judge(gpu, cfg, base))
        return results


def _judge(gpu: GpuPerf, cfg: DeepGpuPerfConfig, base: Mapping[str, Any]) -> list[Result]:
    matmul_floor = threshold_for(gpu.name, cfg.min_matmul_tflops, cfg.default_min_matmul_tflops)
    copy_floor = threshold_for(gpu.name, cfg.min_copy_gbps, cfg.default_min_copy_gbps)
    evidence = {
        **base,
        "index": gpu.index,
        "name": gpu.name,
        "matmul_tflops": gpu.matmul_tflops,
        "h2d_gbps": gpu.h2d_gbps,
        "d2h_gbps": gpu.d2h_gbps,
        "min_matmul_tflops": matmul_floor,
        "min_copy_gbps": copy_floor,
    }
    found: list[Result] = []
    if matmul_floor is not None and gpu.matmul_tflops < matmul_floor:
        found.append(
            deep_fault(
                NAME,
                Status.CRITICAL,
                "gpu.perf.matmul",
                f"GPU {gpu.index} ({gpu.name}): matmul {gpu.matmul_tflops:g} TFLOPS,"
                f" expected at least {matmul_floor:g}",
                target=gpu.target,
                evidence=evidence,
            )
        )
    for direction, value in (("h2d", gpu.h2d_gbps), ("d2h", gpu.d2h_gbps)):
        if copy_floor is not None and value < copy_floor:
            found.append(
                deep_fault(
                    NAME,
                    Status.CRITICAL,
                    f"gpu.pcie.{direction}_bw",
                    f"GPU {gpu.index} ({gpu.name}): {direction} copy {value:g} GB/s,"
                    f" expected at least {copy_floor:g}",
                    target=gpu.target,
                    evidence=evidence,
                )
            )
    if not found:
        found.append(
            ok(
                NAME,
                f"GPU {gpu.index}: matmul {gpu.matmul_tflops:g} TFLOPS,"
                f" h2d {gpu.h2d_gbps:g} GB/s, d2h {gpu.d2h_gbps:g} GB/s",
                target=gpu.target,
                evidence=evidence,
            )
        )
    return found
