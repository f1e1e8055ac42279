"""The launcher: a batch/v1 Job ``<job>-launcher`` whose pod runs ``mpirun``.

Retries and deadline are the Job controller's, copied from ``runPolicy``; the TTL is not: the
operator deletes a finished job's launcher Job itself once the MPIJob's status records the end
(:mod:`mpijob.desired.sync`), so the Job controller never deletes it before its outcome is read.
Called by the reconcile loop when the launcher is missing; :func:`sync_scheduling_directives`
serves the resume path, where Kueue may have changed where the launcher may run.
"""

from __future__ import annotations

from typing import Any

from mpijob import keys
from mpijob.api import MPIJob
from mpijob.desired import config_map, events, launch, names, ssh, template
from mpijob.desired.events import Event
from mpijob.objects import clone

CONFIG_VOLUME_NAME = "mpi-job-config"
CONFIG_MOUNT_PATH = "/etc/mpi"
HOSTFILE_PATH = f"{CONFIG_MOUNT_PATH}/{config_map.HOSTFILE_KEY}"
_SSH_RETRIES = "-o ConnectionAttempts=10"
RESTART_POLICY_OVERRIDDEN = (
    "Restart policy in pod template overridden by restart policy in replica spec"
)


def implementation_env(job: MPIJob) -> list[dict[str, str]]:
    """The launcher env that points the job's MPI implementation at the hostfile, and at the
    operator's launch agent when the job asks for it (else at ssh, with retries)."""
    slots = str(job.spec.slots_per_worker if job.spec.slots_per_worker is not None else 1)
    env = template.env_var
    implementation = job.spec.mpi_implementation
    agent = (
        [env(k, v) for k, v in launch.implementation_env(implementation)]
        if job.launch_agent
        else []
    )
    if implementation == keys.IMPL_OPENMPI:
        # Open MPI 4's mpirun is ORTE's and reads the OMPI_MCA_orte_* names. Open MPI 5's is
        # PRRTE's, which since 3.0.7 reads only PRTE_MCA_* (it translates the ORTE names only
        # under --personality ompi): without these it finds no hostfile and runs every rank on
        # the launcher, and the job still succeeds. Each runtime ignores the other's names.
        # PRRTE keeps FQDNs off: it ssh-es to the hostfile's names either way, but it knows its
        # own host only by the short name, so a launcher that is also a worker (its FQDN in the
        # hostfile) would ssh to itself, where no sshd runs.
        # With the launch agent, the ssh options give way to the agent's settings (Open MPI 4's
        # where upstream puts its ssh options, Open MPI 5's after PRRTE's names).
        ompi4 = [e for e in agent if e["name"].startswith("OMPI_")]
        ompi5 = [e for e in agent if e["name"].startswith("PRTE_")]
        return [
            env("OMPI_MCA_orte_keep_fqdn_hostnames", "true"),
            env("OMPI_MCA_orte_default_hostfile", HOSTFILE_PATH),
            *(ompi4 or [env("OMPI_MCA_plm_rsh_args", _SSH_RETRIES)]),
            env("OMPI_MCA_orte_set_default_slots", slots),
            env("PRTE_MCA_prte_keep_fqdn_hostnames", "false"),
            env("PRTE_MCA_prte_default_hostfile", HOSTFILE_PATH),
            *(ompi5 or [env("PRTE_MCA_plm_ssh_args", _SSH_RETRIES)]),
            env("PRTE_MCA_prte_set_default_slots", slots),
        ]
    if implementation == keys.IMPL_INTEL:
        return [
            env("I_MPI_HYDRA_HOST_FILE", HOSTFILE_PATH),
            *(agent or [env("I_MPI_HYDRA_BOOTSTRAP_EXEC_EXTRA_ARGS", _SSH_RETRIES)]),
            env("I_MPI_PERHOST", slots),
        ]
    if implementation == keys.IMPL_MPICH:
        return [
            env("HYDRA_HOST_FILE", HOSTFILE_PATH),
            *(agent or [env("HYDRA_LAUNCH_EXTRA_ARGS", _SSH_RETRIES)]),
        ]
    return []


def build_launcher_template(
    job: MPIJob, launch_image: str = ""
) -> tuple[dict[str, Any], list[Event]]:
    """The launcher's pod template, and the Warning to emit if the user's restart policy lost.
    ``launch_image`` holds the launch agent a job with ``mpijob.io/launch: agent`` copies in."""
    pod = template.copy_template(job.spec.launcher)
    labels = names.launcher_selector(job)
    if job.spec.launcher_is_worker:
        labels[keys.LABEL_REPLICA_INDEX] = "0"
    template.add_labels(pod, labels)
    template.set_host(pod, job, names.launcher_name(job))
    env = [template.env_var(template.ENV_JOB_ROLE, keys.ROLE_LAUNCHER), *implementation_env(job)]
    if not job.spec.launcher_is_worker:
        # Hide GPUs from a launcher that only runs mpirun, whatever the runtime would expose.
        env += [
            template.env_var("NVIDIA_VISIBLE_DEVICES", ""),
            template.env_var("NVIDIA_DRIVER_CAPABILITIES", ""),
        ]
    template.append_env(pod, env)
    spec = pod["spec"]
    if job.launch_agent:
        launch.add_to_launcher(job, spec, launch_image)
    else:
        ssh.add_ssh_volume(job, spec)
    warnings = []
    if spec.get("restartPolicy"):
        warnings.append(events.warning(keys.REASON_SET_RESTART_POLICY, RESTART_POLICY_OVERRIDDEN))
    spec["restartPolicy"] = template.restart_policy(job.spec.launcher)
    spec["volumes"] = [*(spec.get("volumes") or []), _config_volume(job)]
    container = spec["containers"][0]
    container["volumeMounts"] = [
        *(container.get("volumeMounts") or []),
        {"name": CONFIG_VOLUME_NAME, "mountPath": CONFIG_MOUNT_PATH},
    ]
    metadata: dict[str, Any] = {"labels": pod["metadata"]["labels"]}
    if pod["metadata"].get("annotations"):
        metadata["annotations"] = pod["metadata"]["annotations"]
    metadata["ownerReferences"] = [names.owner_reference(job)]
    return {"metadata": metadata, "spec": spec}, warnings


def build_launcher_job(job: MPIJob, launch_image: str = "") -> tuple[dict[str, Any], list[Event]]:
    """The desired batch/v1 Job of the launcher, and the Events building it asks for."""
    pod_template, warnings = build_launcher_template(job, launch_image)
    policy = job.spec.run_policy
    spec: dict[str, Any] = {}
    for field, value in (
        ("activeDeadlineSeconds", policy.active_deadline_seconds),
        ("backoffLimit", policy.backoff_limit),
    ):
        if value is not None:
            spec[field] = value
    spec["template"] = pod_template
    spec["podReplacementPolicy"] = "Failed"
    if job.spec.suspended:
        spec["suspend"] = True
    launcher_job = {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": names.child_metadata(job, names.launcher_name(job), names.app_labels(job)),
        "spec": spec,
    }
    return launcher_job, warnings


def sync_scheduling_directives(
    live_job: dict[str, Any], desired_job: dict[str, Any]
) -> dict[str, Any]:
    """A copy of the live launcher Job carrying the desired template's scheduling directives.

    Labels and annotations are merged with the desired values winning; ``nodeSelector``,
    ``tolerations`` and ``schedulingGates`` are replaced (absent in the desired template means
    removed). ``suspend`` is left to the caller. The live object is not modified.
    """
    updated = clone(live_job)
    live_template = updated.setdefault("spec", {}).setdefault("template", {})
    desired_template = desired_job.get("spec", {}).get("template", {})
    live_meta = live_template.setdefault("metadata", {})
    desired_meta = desired_template.get("metadata") or {}
    live_meta["labels"] = {**(live_meta.get("labels") or {}), **(desired_meta.get("labels") or {})}
    if desired_meta.get("annotations"):
        live_meta["annotations"] = {
            **(live_meta.get("annotations") or {}),
            **desired_meta["annotations"],
        }
    live_spec = live_template.setdefault("spec", {})
    desired_spec = desired_template.get("spec") or {}
    for field in ("nodeSelector", "tolerations", "schedulingGates"):
        value = desired_spec.get(field)
        if value:
            live_spec[field] = clone(value)
        else:
            live_spec.pop(field, None)
    return updated


def _config_volume(job: MPIJob) -> dict[str, Any]:
    return {
        "name": CONFIG_VOLUME_NAME,
        "configMap": {
            "name": names.config_map_name(job),
            "items": [
                {"key": config_map.HOSTFILE_KEY, "path": config_map.HOSTFILE_KEY, "mode": 0o444},
                {
                    "key": config_map.DISCOVER_HOSTS_KEY,
                    "path": config_map.DISCOVER_HOSTS_KEY,
                    "mode": 0o555,
                },
            ],
        },
    }
