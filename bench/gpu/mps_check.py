#!/usr/bin/env python3
"""Checks on a real NVIDIA GPU that a fractional share is limited the way docs/gpu-shares.md says.

Run as root on a GPU machine with the NVIDIA driver, the MPS binaries, PyTorch and
nvidia-ml-py (never in CI):

    PYTHONPATH=operator python3 bench/gpu/mps_check.py [--json OUT.json] [--seconds 4]

It starts GPU 0's MPS control daemon with the agent's own code (:class:`MpsDaemon`, default
caps, exactly as ``mpijob-agent --share-gpus`` does), then runs CUDA processes whose environment
is what :func:`mpijob.shares.pod_edits.pod_edits` writes for a pod holding the share (as the
kubelet resolves it at container start, :func:`~mpijob.shares.pod_edits.resolve_env`): a bf16
8192^3 matmul for throughput, plain allocations for the memory limit. Phases:

1. unrestricted baselines: without MPS, and as an MPS client without limits;
2. 30% and 70% shares, then three 30% clients together (started on one signal);
3. the ``cuda-sample`` share (2 GiB, 30%): 3 GiB refused, 1 GiB allowed, the largest
   allocation that succeeds (before and after cuBLAS loads), what the CUDA context takes;
4. a 4 GiB share: the same search (is the context's part constant?);
5. a client with a private ``/dev/shm`` (does a client pod need the host's?);
6. daemon-side caps: the daemon restarted with a 50% default before its first client; a client
   without env, and one asking 70%, must both stay near 50%.

Prints a table, then one JSON line (``SUMMARY {...}``). The daemons are stopped on exit. Never
changes the GPU's settings (compute mode, power, clocks).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

N = 8192
GIB = 1 << 30
MIB = 1 << 20


# --- Client side (a separate process per client) --------------------------------------------


def client_matmul(seconds: float, ready: str | None, go: str | None) -> dict[str, Any]:
    import torch

    torch.backends.cuda.matmul.allow_tf32 = False
    a = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(N, N, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    if ready and go:
        Path(ready).write_text("ready")
        while not Path(go).exists():
            time.sleep(0.005)
        start_at = float(Path(go).read_text())
        while time.time() < start_at:
            time.sleep(0.0005)
    began = time.time()
    start = time.perf_counter()
    count = 0
    burst = 0.0
    while time.perf_counter() - start < seconds:
        for _ in range(4):
            torch.matmul(a, b)
        torch.cuda.synchronize()
        count += 4
        if count == 20:  # the first ~30 ms: before power management settles the clocks
            burst = 2 * N**3 * count / (time.perf_counter() - start) / 1e12
    elapsed = time.perf_counter() - start
    return {
        "tflops": 2 * N**3 * count / elapsed / 1e12,
        "burst_tflops": burst,
        "matmuls": count,
        "seconds": elapsed,
        "began": began,
        "ended": time.time(),
    }


def _try_alloc(torch: Any, size: int) -> tuple[bool, str]:
    try:
        block = torch.empty(size, dtype=torch.uint8, device="cuda")
        torch.cuda.synchronize()
        del block
        torch.cuda.synchronize()
        return True, ""
    except (RuntimeError, torch.OutOfMemoryError) as error:
        return False, str(error).splitlines()[0][:160]


def _largest(torch: Any, high: int) -> int:
    """Largest allocation (16 MiB steps) that succeeds, searching up to ``high`` bytes."""
    low, step = 0, 16 * MIB
    high = high // step
    while low < high:
        mid = (low + high + 1) // 2
        if _try_alloc(torch, mid * step)[0]:
            low = mid
        else:
            high = mid - 1
    return low * step


def client_memory(limit_gib: int, probes: list[float]) -> dict[str, Any]:
    import torch

    torch.ones(1, device="cuda")  # the context, nothing else
    torch.cuda.synchronize()
    free, total = torch.cuda.mem_get_info()
    out: dict[str, Any] = {
        "mem_get_info_free_mib": free // MIB,
        "mem_get_info_total_mib": total // MIB,
    }
    for gib in probes:
        ok, error = _try_alloc(torch, int(gib * GIB))
        out[f"alloc_{gib:g}g"] = ok
        if error:
            out[f"alloc_{gib:g}g_error"] = error
    search_to = (limit_gib + 1) * GIB if limit_gib else total
    out["largest_before_cublas_mib"] = _largest(torch, search_to) // MIB
    a = torch.randn(1024, 1024, device="cuda", dtype=torch.bfloat16)
    torch.matmul(a, a)
    torch.cuda.synchronize()
    del a
    out["largest_after_cublas_mib"] = _largest(torch, search_to) // MIB
    free, total = torch.cuda.mem_get_info()
    out["mem_get_info_after_free_mib"] = free // MIB
    held = torch.empty(GIB, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    out["nvidia_smi_apps_holding_1g"] = _smi(
        "--query-compute-apps=pid,process_name,used_memory", "--format=csv,noheader"
    )
    out["nvidia_smi_used_holding_1g"] = _smi("--query-gpu=memory.used", "--format=csv,noheader")
    del held
    return out


def client_light() -> dict[str, Any]:
    import torch

    a = torch.randn(2048, 2048, device="cuda", dtype=torch.bfloat16)
    value = float(torch.matmul(a, a).float().abs().mean())
    torch.cuda.synchronize()
    return {"ok": value > 0}


def _smi(*args: str) -> str:
    try:
        return subprocess.run(
            ["nvidia-smi", *args], capture_output=True, text=True, timeout=30, check=False
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"nvidia-smi failed: {error}"


# --- Orchestration ---------------------------------------------------------------------------


class Check:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.rows: list[tuple[str, str, str]] = []
        self.summary: dict[str, Any] = {}
        self.work = Path(tempfile.mkdtemp(prefix="mps-check-"))
        self.samples = self.work / "smi.csv"
        # NVML sampling on the CPU side, outside the clients: SM clock, power, throttle reasons.
        self.sampler = subprocess.Popen(
            [
                "nvidia-smi",
                "--query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,"
                "clocks_event_reasons.active",
                "--format=csv,noheader,nounits",
                "-lms",
                "250",
            ],
            stdout=self.samples.open("w"),
            stderr=subprocess.DEVNULL,
        )

    def gpu_during(self, result: dict[str, Any]) -> str:
        """Median SM clock and power over a client's timed window, with the throttle reasons."""
        if "began" not in result:
            return ""
        import datetime as dt

        clocks, powers, reasons = [], [], set()
        for line in self.samples.read_text().splitlines():
            parts = [p.strip() for p in line.split(",")]
            if len(parts) < 5:
                continue
            try:
                when = dt.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
                clock, power = float(parts[1]), float(parts[2])
            except ValueError:
                continue
            if result["began"] + 0.5 <= when <= result["ended"]:
                clocks.append(clock)
                powers.append(power)
                reasons.add(parts[4])
        if not clocks:
            return "no samples"
        clocks.sort()
        powers.sort()
        result["sm_mhz"] = clocks[len(clocks) // 2]
        result["power_w"] = powers[len(powers) // 2]
        result["throttle"] = sorted(reasons)
        return f"{result['sm_mhz']:.0f} MHz {result['power_w']:.0f} W {'/'.join(sorted(reasons))}"

    def spawn(self, env: dict[str, str], *args: str, prefix: list[str] | None = None) -> Any:
        full = {**os.environ, **env, "PYTHONUNBUFFERED": "1"}
        argv = [*(prefix or []), sys.executable, __file__, "client", *args]
        return subprocess.Popen(
            argv, env=full, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )

    def collect(self, proc: Any, timeout: float = 240) -> dict[str, Any]:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            return {"error": "timed out", "stderr": err[-800:]}
        for line in reversed(out.splitlines()):
            if line.startswith("RESULT "):
                return dict(json.loads(line[7:]))
        return {"error": f"exit {proc.returncode}", "stderr": err[-800:]}

    def run(
        self, env: dict[str, str], *args: str, prefix: list[str] | None = None
    ) -> dict[str, Any]:
        return self.collect(self.spawn(env, *args, prefix=prefix))

    def matmul(self, env: dict[str, str]) -> dict[str, Any]:
        return self.run(env, "matmul", "--seconds", str(self.seconds))

    def together(self, envs: list[dict[str, str]]) -> list[dict[str, Any]]:
        """Clients that warm up apart and start their timed loops on one signal."""
        go = self.work / f"go-{time.monotonic_ns()}"
        readies = [self.work / f"ready-{i}-{time.monotonic_ns()}" for i in range(len(envs))]
        procs = [
            self.spawn(
                env, "matmul", "--seconds", str(self.seconds), "--ready", str(r), "--go", str(go)
            )
            for env, r in zip(envs, readies, strict=True)
        ]
        deadline = time.monotonic() + 180
        while not all(r.exists() for r in readies):
            if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
                break
            time.sleep(0.05)
        go.write_text(str(time.time() + 0.5))
        return [self.collect(p) for p in procs]

    def row(self, name: str, value: str, verdict: str = "") -> None:
        self.rows.append((name, value, verdict))
        print(f"  {name:<52} {value:<44} {verdict}", flush=True)


def share_env(uuid: str, index: int, memory_gib: int, percentage: int | None) -> dict[str, str]:
    """The environment a one-container pod holding this share starts with (pod_edits)."""
    from mpijob import keys
    from mpijob.shares.pod_edits import pod_edits, resolve_env
    from mpijob.shares.request import Placed, Share

    limits: dict[str, Any] = {keys.GPU_MEM_RESOURCE: str(memory_gib)}
    if percentage is not None:
        limits[keys.GPU_CORE_PERCENTAGE_RESOURCE] = str(percentage)
    pod = {"spec": {"containers": [{"name": "cuda", "resources": {"limits": limits}}]}}
    placed = Placed("this-node", index, uuid, Share(memory_gib, percentage))
    edits = pod_edits(pod, placed)
    # As the kubelet resolves it at container start: the UUID read from the pod's annotation.
    annotations = {k: v for k, v in edits.annotations.items() if v is not None}
    return resolve_env(edits.env[0], annotations)


def mps_only_env(uuid: str) -> dict[str, str]:
    """An MPS client of the same daemon with no limit at all (the unrestricted baseline)."""
    from mpijob import keys

    env = share_env(uuid, 0, 1, None)
    env.pop(keys.ENV_MPS_PINNED_DEVICE_MEM_LIMIT)
    return env


def fmt(result: dict[str, Any], key: str = "tflops") -> str:
    if "error" in result:
        return f"ERROR {result['error']}: {result.get('stderr', '')[-200:]!r}"
    return f"{result[key]:.0f} TFLOP/s"


def orchestrate(args: argparse.Namespace) -> int:  # noqa: PLR0915 (one script, read top to bottom)
    import pynvml

    from mpijob.agent.mps import Defaults, MpsDaemon
    from mpijob.agent.share import extended_resources, read_gpus

    check = Check(args.seconds)
    gpus = read_gpus(pynvml)
    gpu = gpus[0]
    summary = check.summary
    summary["gpu"] = {"index": gpu.index, "uuid": gpu.uuid, "memory_gib": gpu.memory_gib}
    summary["advertised"] = extended_resources(gpus)
    summary["nvidia_smi_L"] = _smi("-L")
    summary["driver"] = _smi(
        "--query-gpu=driver_version,compute_mode,name", "--format=csv,noheader"
    )
    print(f"GPU {gpu.index} {gpu.uuid} {gpu.memory_gib} GiB; advertised {summary['advertised']}")
    print(f"driver/compute mode/name: {summary['driver']}")

    daemon = MpsDaemon(gpu.uuid, root=args.root)
    ok = True
    try:
        print("\n== 1. Baselines")
        direct = check.matmul({})
        summary["direct"] = direct
        check.row("no MPS, no limits", fmt(direct))
        health = daemon.start(Defaults())
        summary["daemon_start"] = dict(health.__dict__)
        summary["pipe_entries"] = sorted(os.listdir(daemon.dirs.pipe))
        check.row(
            "MPS daemon started by agent code", f"ok={health.ok} default={health.percentage}%"
        )
        check.row("  GPU during it", check.gpu_during(direct))
        rounds: dict[str, list[dict[str, Any]]] = {"mps_unrestricted": [], "30": [], "70": []}
        env30 = share_env(gpu.uuid, gpu.index, 10, 30)
        env70 = share_env(gpu.uuid, gpu.index, 10, 70)
        summary["env_30"] = env30
        print(f"  env of a (10 GiB, 30%) share: {env30}")
        for turn in range(args.rounds):
            for name, env in (
                ("mps_unrestricted", mps_only_env(gpu.uuid)),
                ("30", env30),
                ("70", env70),
            ):
                result = check.matmul(env)
                result["gpu"] = check.gpu_during(result)
                rounds[name].append(result)
                check.row(
                    f"round {turn + 1}: {name}",
                    f"{fmt(result)} burst {result.get('burst_tflops', 0):.0f}",
                    result["gpu"],
                )
        summary["rounds"] = rounds

        def mean(name: str, key: str = "tflops") -> float:
            values = [r.get(key, 0.0) for r in rounds[name]]
            return sum(values) / len(values) if values else 0.0

        baseline = mean("mps_unrestricted")
        summary["baseline_tflops"] = baseline
        summary["baseline_burst_tflops"] = mean("mps_unrestricted", "burst_tflops")
        print("\n== 2. Compute shares (env from shares.pod_edits.pod_edits), means of the rounds")
        check.row("MPS client, no limits (baseline)", f"{baseline:.0f} TFLOP/s")
        ratio30 = mean("30") / baseline if baseline else 0
        pass30 = bool(baseline) and ratio30 <= 0.40
        ok &= pass30
        check.row(
            "30% client",
            f"{mean('30'):.0f} TFLOP/s = {ratio30:.1%} of baseline",
            _v(pass30, "<= 40%"),
        )
        ratio70 = mean("70") / baseline if baseline else 0
        pass70 = bool(baseline) and ratio70 >= 0.60
        ok &= pass70
        check.row(
            "70% client",
            f"{mean('70'):.0f} TFLOP/s = {ratio70:.1%} of baseline",
            _v(pass70, ">= 60%"),
        )
        for name in ("30", "70"):
            b = mean("mps_unrestricted", "burst_tflops")
            check.row(
                f"  burst (first 20 matmuls): {name}%",
                f"{mean(name, 'burst_tflops'):.0f} TFLOP/s = "
                f"{mean(name, 'burst_tflops') / b if b else 0:.1%} of burst baseline {b:.0f}",
            )
        three = check.together([share_env(gpu.uuid, gpu.index, 10, 30)] * 3)
        summary["three_30"] = three
        total = sum(r.get("tflops", 0) for r in three)
        overlap = min((r.get("ended", 0) for r in three), default=0) - max(
            (r.get("began", 0) for r in three), default=0
        )
        summary["three_30_total_tflops"] = total
        summary["three_30_overlap_s"] = overlap
        pass3 = bool(baseline) and total <= baseline and all("tflops" in r for r in three)
        ok &= pass3
        for i, r in enumerate(three):
            check.row(f"  30% client {i + 1} of 3 (together)", fmt(r), check.gpu_during(r))
        check.row(
            "three 30% clients, sum",
            f"{total:.0f} TFLOP/s = {total / baseline if baseline else 0:.0%},"
            f" overlap {overlap:.1f}s",
            _v(pass3, "<= 100%"),
        )

        print("\n== 3. Memory: the cuda-sample share (2 GiB, 30%)")
        env2 = share_env(gpu.uuid, gpu.index, 2, 30)
        summary["env_cuda_sample"] = env2
        print(f"  env: {env2}")
        m2 = check.run(
            {**env2, "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
            "memory",
            "--limit",
            "2",
            "--probe",
            "3",
            "--probe",
            "1",
        )
        summary["memory_2g"] = m2
        pass_m = m2.get("alloc_3g") is False and m2.get("alloc_1g") is True
        ok &= pass_m
        check.row(
            "2 GiB limit: 3 GiB refused / 1 GiB allowed",
            f"{m2.get('alloc_3g')} / {m2.get('alloc_1g')}",
            _v(pass_m, "False / True"),
        )
        for key in (
            "largest_before_cublas_mib",
            "largest_after_cublas_mib",
            "mem_get_info_total_mib",
            "mem_get_info_free_mib",
        ):
            check.row(f"  {key}", str(m2.get(key, m2.get("error"))))

        print("\n== 4. Memory: a 4 GiB share")
        m4 = check.run(
            {**share_env(gpu.uuid, gpu.index, 4, 30), "PYTORCH_NO_CUDA_MEMORY_CACHING": "1"},
            "memory",
            "--limit",
            "4",
            "--probe",
            "5",
            "--probe",
            "3",
        )
        summary["memory_4g"] = m4
        for key in (
            "alloc_5g",
            "alloc_3g",
            "largest_before_cublas_mib",
            "largest_after_cublas_mib",
            "mem_get_info_total_mib",
        ):
            check.row(f"  4 GiB: {key}", str(m4.get(key, m4.get("error"))))
        md = check.run({"PYTORCH_NO_CUDA_MEMORY_CACHING": "1"}, "memory", "--limit", "0")
        summary["memory_direct"] = {k: v for k, v in md.items() if "largest" not in k}
        check.row(
            "no MPS: nvidia-smi apps holding 1 GiB",
            str(md.get("nvidia_smi_apps_holding_1g", md.get("error"))),
        )
        check.row(
            "no MPS: mem_get_info free after context (MiB)",
            str(md.get("mem_get_info_free_mib", md.get("error"))),
        )

        print("\n== 5. A client with a private /dev/shm")
        private = check.run(
            share_env(gpu.uuid, gpu.index, 2, 30),
            "light",
            prefix=[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount -t tmpfs tmpfs /dev/shm && exec "$@"',
                "sh",
            ],
        )
        summary["private_shm"] = private
        check.row("client with its own /dev/shm", str(private.get("ok", private)))
        isolated = check.run(
            share_env(gpu.uuid, gpu.index, 2, 30),
            "light",
            prefix=[
                "unshare",
                "--mount",
                "--ipc",
                "--pid",
                "--uts",
                "--fork",
                "--mount-proc",
                "--propagation",
                "private",
                "sh",
                "-c",
                'mount -t tmpfs tmpfs /dev/shm && mount -t tmpfs tmpfs /tmp && exec "$@"',
                "sh",
            ],
        )
        summary["isolated_namespaces"] = isolated
        check.row("client in own mount/IPC/PID/UTS namespaces", str(isolated.get("ok", isolated)))
        pipe = daemon.dirs.pipe
        readonly = check.run(
            share_env(gpu.uuid, gpu.index, 2, 30),
            "light",
            prefix=[
                "unshare",
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                f'mount --bind {pipe} {pipe} && mount -o remount,bind,ro {pipe} && exec "$@"',
                "sh",
            ],
        )
        summary["readonly_pipe"] = readonly
        check.row("client with the pipe directory read-only", str(readonly.get("ok", readonly)))

        print("\n== 6. Daemon-side default of 50%, in place before the first client")
        daemon.stop()
        health50 = daemon.start(Defaults(percentage=50))
        summary["daemon_50"] = dict(health50.__dict__)
        d_none = check.matmul(mps_only_env(gpu.uuid))
        d_70 = check.matmul(share_env(gpu.uuid, gpu.index, 10, 70))
        summary["daemon_50_no_env"] = d_none
        summary["daemon_50_env_70"] = d_70
        no_env, env70 = d_none.get("tflops", 0), d_70.get("tflops", 0)
        check.row(
            "daemon 50%, client without env",
            f"{fmt(d_none)} = {no_env / baseline if baseline else 0:.1%}",
            check.gpu_during(d_none),
        )
        check.row(
            "daemon 50%, client env 70%",
            f"{fmt(d_70)} = {env70 / baseline if baseline else 0:.1%}",
            check.gpu_during(d_70),
        )
        summary["daemon_cap_holds"] = bool(no_env) and env70 <= 1.05 * no_env < mean("70")
        check.row(
            "a client cannot raise the daemon's cap",
            str(summary["daemon_cap_holds"]),
            "(70% env <= 1.05 x no env < 70% alone)",
        )
    finally:
        try:
            daemon.stop()
        except Exception as error:  # the summary still prints
            print(f"stopping the daemon: {error}")
        summary["control_log_tail"] = _tail(Path(daemon.dirs.log, "control.log"))
        check.sampler.terminate()
    summary["passed"] = ok
    print("\nSUMMARY " + json.dumps(summary, default=str))
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2, default=str))
    print("\nALL REQUIRED CHECKS PASSED" if ok else "\nSOME REQUIRED CHECK FAILED")
    return 0 if ok else 1


def _v(passed: bool, rule: str) -> str:
    return f"{'PASS' if passed else 'FAIL'} ({rule})"


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text().splitlines()[-lines:])
    except OSError as error:
        return str(error)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="role")
    client = sub.add_parser("client")
    client.add_argument("mode", choices=["matmul", "memory", "light"])
    client.add_argument("--seconds", type=float, default=4.0)
    client.add_argument("--ready")
    client.add_argument("--go")
    client.add_argument("--limit", type=int, default=0)
    client.add_argument("--probe", type=float, action="append", default=[])
    parser.add_argument("--seconds", type=float, default=4.0, help="timed matmul loop per client")
    parser.add_argument("--json", help="also write the summary here")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved baseline/30/70 runs")
    parser.add_argument(
        "--root", default="/run/mpijob/mps", help="MPS host directory (the agent's)"
    )
    args = parser.parse_args()
    if args.role == "client":
        if args.mode == "matmul":
            result = client_matmul(args.seconds, args.ready, args.go)
        elif args.mode == "memory":
            result = client_memory(args.limit, args.probe)
        else:
            result = client_light()
        print("RESULT " + json.dumps(result), flush=True)
        return 0
    return orchestrate(args)


if __name__ == "__main__":
    raise SystemExit(main())
