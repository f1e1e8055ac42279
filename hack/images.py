#!/usr/bin/env python3
"""OCI images for the real node, built from Debian packages without a registry or Docker.

``mpioperator/mpi-pi:openmpi``, ``:mpich`` and ``:intel`` carry upstream's image names, so
upstream's pi examples run unchanged (``imagePullPolicy: IfNotPresent``): a minimal Debian rootfs
made by mmdebstrap, the MPI implementation, OpenSSH (port 2222, no host-key checks, ``mpiuser``
uid 1000 with its own sshd config) and the pi program (hack/mpi-pi/pi.c) compiled in the image,
its compiler removed again. ``:openmpi`` is Open MPI 5 (trixie), as upstream's image has been
since mpi-operator v0.7.0; ``:openmpi4`` keeps Open MPI 4.1 (bookworm) for the clusters that
still run it. ``:intel`` is Intel MPI's runtime and compiler wrappers from PyPI (``impi-rt``,
``impi-devel``; Intel MPI is not in Debian's archive) over a trixie rootfs.
``mpijob.local/pause`` is the pod sandbox image (hack/pause/pause.go).

Each image is one uncompressed layer in an OCI archive under
``~/.cache/mpijob-operator/images/``, named after a digest of its recipe (this file and the files
it copies in), so it is rebuilt only when the recipe changes. ``import_all`` loads them into the
real node's containerd (hack/realnode.py).

``mpijob.local/pytorch-benchmark:openmpi`` is the training image (below).

Usage: python -m hack.images build [openmpi|openmpi4|mpich|intel|pytorch|pause ...]   (default: all)
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from hack import common

HACK = Path(__file__).resolve().parent
ROOT = HACK.parent
# Debian release per flavour. MPICH comes from trixie (4.2): bookworm's 4.0 on UCX now and then
# hung in MPI_Finalize when ranks sat in two pods of one node (one rank spun waiting for a reply
# that the other, already blocked in the process manager's barrier, never read).
SUITES = {"openmpi": "trixie", "openmpi4": "bookworm", "mpich": "trixie", "intel": "trixie"}
REPO = "docker.io/mpioperator/mpi-pi"
PAUSE = "mpijob.local/pause:1"
PATH_ENV = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# What each MPI flavour installs: runtime packages stay, build packages are purged after pi is
# compiled.
FLAVOURS: dict[str, dict[str, list[str]]] = {
    "openmpi": {"runtime": ["openmpi-bin"], "build": ["libopenmpi-dev"]},
    "openmpi4": {"runtime": ["openmpi-bin"], "build": ["libopenmpi-dev"]},
    "mpich": {"runtime": ["mpich"], "build": ["libmpich-dev"]},
    # Intel MPI comes from PyPI's wheels (intel_mpi_tree), copied in by a hook.
    "intel": {"runtime": [], "build": []},
}
# Intel MPI's PyPI release (hack/versions.env: INTEL_MPI_VERSION) and where the image has it.
INTEL_MPI_ROOT = "/opt/intel/mpi"
# What pi and Hydra use of the wheels: the launcher, its proxies, the MPI and libfabric libraries
# with their providers, the compiler wrappers and headers. Not the benchmarks (IMB-*), Java,
# Fortran modules, conda scripts or GPU kernels, which only make the image larger.
INTEL_MPI_KEEP = ("bin/", "lib/", "include/")
INTEL_MPI_DROP = ("bin/IMB-", "bin/libfabric/", "bin/mpitune", "lib/libmpijava", "include/mpi/")
COMMON_RUNTIME = ["openssh-server", "openssh-client", "ca-certificates"]
COMMON_BUILD = ["gcc", "libc6-dev"]
RECIPE_FILES = [
    HACK / "mpi-pi/pi.c",
    HACK / "mpi-pi/entrypoint.sh",
    HACK / "mpi-pi/sshd_config",
]


def say(msg: str) -> None:
    print(f"[images] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> SystemExit:
    return SystemExit(f"[images] error: {msg}")


def cache_dir() -> Path:
    return common.cache_dir() / "images"


def recipe_digest(files: list[Path], extra: str) -> str:
    h = hashlib.sha256(extra.encode())
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def archive_path(name: str) -> Path:
    """The image's archive, named after its recipe: what it installs and runs, the files it
    copies in (not this file's layout, so editing a comment here rebuilds nothing)."""
    if name == "pytorch":
        return pytorch_archive_path()
    if name.endswith(NOSSHD_SUFFIX):
        base = archive_path(name.removesuffix(NOSSHD_SUFFIX))
        digest = recipe_digest([], json.dumps([base.name, SSHD_PATHS]))
        return cache_dir() / f"{name}-{digest}.oci.tar"
    if name == "pause":
        digest = recipe_digest([HACK / "pause/pause.go"], "pause")
    else:
        recipe = [a.replace(str(HACK), "hack") for a in mpi_recipe(name)]
        extra = [recipe, EXTRA_DIRS, image_config(name)]
        if name == "intel":
            extra.append(common.versions()["INTEL_MPI_VERSION"])
        digest = recipe_digest(RECIPE_FILES, json.dumps(extra))
    return cache_dir() / f"{name}-{digest}.oci.tar"


def reference(name: str) -> str:
    if name.endswith(NOSSHD_SUFFIX):
        repo, _, tag = reference(name.removesuffix(NOSSHD_SUFFIX)).rpartition(":")
        return f"mpijob.local/{repo.rsplit('/', 1)[-1]}{NOSSHD_SUFFIX}:{tag}"
    if name == "pytorch":
        return PYTORCH_REFERENCE
    return PAUSE if name == "pause" else f"{REPO}:{name}"


def _blob(out: tarfile.TarFile, data: bytes | Path) -> tuple[str, int]:
    """Adds a blob to the OCI layout; returns its digest and size."""
    h = hashlib.sha256()
    if isinstance(data, Path):
        with data.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
        size = data.stat().st_size
        digest = h.hexdigest()
        out.add(str(data), arcname=f"blobs/sha256/{digest}")
    else:
        h.update(data)
        size = len(data)
        digest = h.hexdigest()
        info = tarfile.TarInfo(f"blobs/sha256/{digest}")
        info.size = size
        out.addfile(info, io.BytesIO(data))
    return f"sha256:{digest}", size


def write_oci(layer: Path, ref: str, config: dict[str, object], dest: Path) -> None:
    """An OCI image-layout archive of one uncompressed layer, named ``ref`` for containerd."""
    tmp = dest.with_suffix(".partial")
    with tarfile.open(tmp, "w") as out:
        layer_digest, layer_size = _blob(out, layer)
        image_config = {
            "architecture": "amd64",
            "os": "linux",
            "config": config,
            "rootfs": {"type": "layers", "diff_ids": [layer_digest]},
        }
        cfg_digest, cfg_size = _blob(out, json.dumps(image_config).encode())
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {
                "mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": cfg_digest,
                "size": cfg_size,
            },
            "layers": [
                {
                    "mediaType": "application/vnd.oci.image.layer.v1.tar",
                    "digest": layer_digest,
                    "size": layer_size,
                }
            ],
        }
        man_digest, man_size = _blob(out, json.dumps(manifest).encode())
        index = {
            "schemaVersion": 2,
            "manifests": [
                {
                    "mediaType": "application/vnd.oci.image.manifest.v1+json",
                    "digest": man_digest,
                    "size": man_size,
                    "platform": {"architecture": "amd64", "os": "linux"},
                    "annotations": {
                        "io.containerd.image.name": ref,
                        "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
                    },
                }
            ],
        }
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps(index).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    tmp.rename(dest)


#: The worker images of jobs launched by the operator's agent (``mpijob.io/launch: agent``,
#: docs/launch.md), which must run without sshd: each is its base image (``mpi-pi:openmpi`` ->
#: ``mpijob.local/mpi-pi-nosshd:openmpi``) with one more layer that deletes sshd's binaries (OCI
#: whiteouts). containerd stores the base's layer once, and the archive holds only the new
#: blobs, so it is imported after its base (ALL's order).
NOSSHD_SUFFIX = "-nosshd"
NOSSHD_BASES = ("openmpi", "openmpi4", "mpich", "intel", "pytorch")
#: sshd, and the programs trixie's OpenSSH splits it into.
SSHD_PATHS = ("usr/sbin/sshd", "usr/lib/openssh/sshd-session", "usr/lib/openssh/sshd-auth")


def build_nosshd(base: Path, ref: str, dest: Path) -> None:
    """``ref``: the image of archive ``base`` with a last layer that whites out SSHD_PATHS."""
    with tarfile.open(base) as t:

        def read(digest: str) -> dict[str, object]:
            member = t.extractfile(f"blobs/sha256/{digest.removeprefix('sha256:')}")
            assert member is not None
            out: dict[str, object] = json.load(member)
            return out

        index = json.load(t.extractfile("index.json"))  # type: ignore[arg-type]
        manifest = read(index["manifests"][0]["digest"])
        config = read(manifest["config"]["digest"])  # type: ignore[index]
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        for path in SSHD_PATHS:
            folder, _, leaf = path.rpartition("/")
            info = tarfile.TarInfo(f"{folder}/.wh.{leaf}")
            info.mtime = 0
            t.addfile(info, io.BytesIO(b""))
    tmp = dest.with_suffix(".partial")
    with tarfile.open(tmp, "w") as out:
        layer_digest, layer_size = _blob(out, layer.getvalue())
        rootfs = config["rootfs"]
        assert isinstance(rootfs, dict)
        config = {**config, "rootfs": {**rootfs, "diff_ids": [*rootfs["diff_ids"], layer_digest]}}
        cfg_digest, cfg_size = _blob(out, json.dumps(config).encode())
        layers = [
            *manifest["layers"],  # type: ignore[misc]
            {
                "mediaType": "application/vnd.oci.image.layer.v1.tar",
                "digest": layer_digest,
                "size": layer_size,
            },
        ]
        manifest = {
            **manifest,
            "config": {**manifest["config"], "digest": cfg_digest, "size": cfg_size},  # type: ignore[dict-item]
            "layers": layers,
        }
        man_digest, man_size = _blob(out, json.dumps(manifest).encode())
        entry = {
            **index["manifests"][0],
            "digest": man_digest,
            "size": man_size,
            "annotations": {
                "io.containerd.image.name": ref,
                "org.opencontainers.image.ref.name": ref.rsplit(":", 1)[1],
            },
        }
        for name, data in (
            ("oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode()),
            ("index.json", json.dumps({**index, "manifests": [entry]}).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    tmp.rename(dest)


def add_dirs(layer: Path, dirs: dict[str, int]) -> None:
    """Appends the directories mmdebstrap's tarball leaves out (/run's content, among them the
    /run/sshd root's sshd needs) unless the layer has them."""
    with tarfile.open(layer, "r") as t:
        present = {m.name.removeprefix("./").rstrip("/") for m in t.getmembers() if m.isdir()}
    with tarfile.open(layer, "a") as t:
        for path, mode in dirs.items():
            if path not in present:
                info = tarfile.TarInfo(f"./{path}/")
                info.type = tarfile.DIRTYPE
                info.mode = mode
                t.addfile(info)


# Directories mmdebstrap's tarball leaves out (/run's content among them, with the /run/sshd
# root's sshd needs), added to the layer unless present.
EXTRA_DIRS = {"run": 0o755, "run/sshd": 0o755, "tmp": 0o1777, "proc": 0o555, "sys": 0o555}
# Debian's MPICH runs on UCX, which takes two processes for neighbours when they share a kernel
# (its system id is the boot id) and would reach across by shared memory and cross-memory
# attach; pods have their own PID and IPC namespaces. TCP is what ranks in separate pods share.
UCX_TRANSPORTS = "UCX_TLS=self,tcp"
MPI_CONFIG = {
    "Env": [PATH_ENV, UCX_TRANSPORTS],
    "Entrypoint": ["/entrypoint.sh"],
    "Cmd": ["/bin/bash"],
    "WorkingDir": "/home/mpiuser",
}
# Intel MPI's environment, as its own mpivars script sets it, with libfabric's TCP provider:
# ranks in separate pods share no memory or fabric device, only the pod network. Hydra hands the
# launcher's environment to every rank; the workers' sshd only needs to find the proxies, which
# are linked into /usr/local/bin.
INTEL_ENV = [
    f"I_MPI_ROOT={INTEL_MPI_ROOT}",
    f"FI_PROVIDER_PATH={INTEL_MPI_ROOT}/lib",
    "FI_PROVIDER=tcp",
]


def image_config(name: str) -> dict[str, object]:
    if name != "intel":
        return MPI_CONFIG
    env = [f"PATH={INTEL_MPI_ROOT}/bin:{PATH_ENV.removeprefix('PATH=')}", *INTEL_ENV]
    return {**MPI_CONFIG, "Env": env}


def intel_mpi_tree(dest: Path) -> None:
    """Intel MPI's runtime and development wheels from PyPI, unpacked into ``dest`` as the
    prefix they install to. Wheels cannot hold symlinks, so each library comes as several
    identical files (libmpi.so, .so.12, .so.12.0, ...); the copies become links to one."""
    import zipfile

    version = common.versions()["INTEL_MPI_VERSION"]
    with tempfile.TemporaryDirectory(prefix="impi-wheels-") as wheels:
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps",
             "--only-binary=:all:", "--dest", wheels,
             f"impi-rt=={version}", f"impi-devel=={version}"],
            check=True,
        )  # fmt: skip
        for wheel in sorted(Path(wheels).glob("*.whl")):
            with zipfile.ZipFile(wheel) as z:
                for info in z.infolist():
                    _, sep, rel = info.filename.partition(".data/data/")
                    if not sep or info.is_dir() or not rel.startswith(INTEL_MPI_KEEP):
                        continue
                    if rel.startswith(INTEL_MPI_DROP):
                        continue
                    target = dest / rel
                    target.parent.mkdir(parents=True, exist_ok=True)
                    target.write_bytes(z.read(info))
                    # The wheel keeps the Unix mode in the upper half of external_attr.
                    target.chmod((info.external_attr >> 16) & 0o777 or 0o644)
    by_content: dict[bytes, list[Path]] = {}
    for f in sorted((dest / "lib").rglob("*.so*")):
        by_content.setdefault(hashlib.sha256(f.read_bytes()).digest(), []).append(f)
    for same in by_content.values():
        keep = max(same, key=lambda f: len(f.name))
        for f in same:
            if f != keep and f.parent == keep.parent:
                f.unlink()
                f.symlink_to(keep.name)


def mpi_recipe(name: str) -> list[str]:
    """mmdebstrap's arguments for one flavour, up to the output path."""
    flavour = FLAVOURS[name]
    build = flavour["build"] + COMMON_BUILD
    files = " ".join(str(HACK / "mpi-pi" / f) for f in ("pi.c", "entrypoint.sh", "sshd_config"))
    # ssh and sshd both take the first value they read: append to the client's "Host *" block,
    # and put the server's settings in the drop-in folder Debian's sshd_config includes first.
    ssh_client = (
        "printf '    StrictHostKeyChecking no\\n    UserKnownHostsFile /dev/null\\n"
        '    Port 2222\\n\' >> "$1/etc/ssh/ssh_config"'
    )
    sshd = "printf 'Port 2222\\nStrictModes no\\n' > \"$1/etc/ssh/sshd_config.d/mpi.conf\""
    mpicc = 'chroot "$1" mpicc'
    intel = []
    if name == "intel":
        root = INTEL_MPI_ROOT
        # The tree comes from intel_mpi_tree through the environment, so the recipe (and the
        # archive's name) does not depend on where the cache is.
        intel = [
            f'mkdir -p "$1{root}" && cp -a "$INTEL_MPI_TREE"/. "$1{root}/"',
            f'echo {root}/lib > "$1/etc/ld.so.conf.d/intel-mpi.conf" && chroot "$1" ldconfig',
            f'for b in "$1{root}"/bin/*; do '
            f'ln -s "{root}/bin/${{b##*/}}" "$1/usr/local/bin/"; done',
        ]
        mpicc = f'chroot "$1" env I_MPI_ROOT={root} {root}/bin/mpicc'
    hooks = [
        f'mkdir -p "$1/tmp/recipe" && cp {files} "$1/tmp/recipe/"',
        'chroot "$1" useradd --create-home --uid 1000 --shell /bin/bash mpiuser',
        ssh_client,
        sshd,
        'install -m 0644 -o 1000 -g 1000 "$1/tmp/recipe/sshd_config" '
        '"$1/home/mpiuser/.sshd_config"',
        'install -m 0755 "$1/tmp/recipe/entrypoint.sh" "$1/entrypoint.sh"',
        *intel,
        f"{mpicc} -O2 -o /home/mpiuser/pi /tmp/recipe/pi.c",
        'chown 1000:1000 "$1/home/mpiuser/pi"',
        f'chroot "$1" apt-get purge -y -qq --auto-remove {" ".join(build)} >/dev/null',
        'rm -rf "$1/tmp/recipe" "$1/var/cache/apt/archives"/*.deb "$1/usr/share/doc" '
        '"$1/usr/share/man" "$1/usr/share/locale"',
    ]
    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=apt",
        "--format=tar",
        "--quiet",
        f"--include={','.join(COMMON_RUNTIME + flavour['runtime'] + build)}",
        *(f"--customize-hook={h}" for h in hooks),
        SUITES[name],
    ]


def require_mmdebstrap(what: str) -> None:
    """mmdebstrap, run as root, builds ``what``'s Debian rootfs; say how to get there if not."""
    if not shutil.which("mmdebstrap"):
        raise die(
            f"mmdebstrap is not installed; it builds the Debian rootfs of {what}. Install it: "
            "apt-get install -y mmdebstrap (hack/test-deps.sh does this as root)"
        )
    if os.geteuid() != 0:
        raise die(f"building {what} needs root (mmdebstrap --mode=root)")


def build_mpi(name: str, dest: Path) -> None:
    build_rootfs(name, mpi_recipe(name), reference(name), image_config(name), dest)


def build_rootfs(
    name: str, recipe: list[str], ref: str, config: dict[str, object], dest: Path
) -> None:
    """The image ``ref`` from mmdebstrap's ``recipe`` (its arguments up to the output path)."""
    require_mmdebstrap("the MPI images")
    with tempfile.TemporaryDirectory(prefix="mpi-pi-", dir=dest.parent) as tmp:
        layer = Path(tmp) / "rootfs.tar"
        env = dict(os.environ)
        if name == "intel":
            tree = Path(tmp) / "intel-mpi"
            intel_mpi_tree(tree)
            env["INTEL_MPI_TREE"] = str(tree)
        result = subprocess.run([*recipe, str(layer)], env=env, check=False)
        if result.returncode != 0:
            raise die(
                f"mmdebstrap failed for {ref} (exit {result.returncode}); it needs "
                "Debian's archive (apt's sources) reachable"
            )
        add_dirs(layer, EXTRA_DIRS)
        write_oci(layer, ref, config, dest)


def build_pause(dest: Path) -> None:
    if not shutil.which("go"):
        raise die("Go is needed to build the pod sandbox (pause) image")
    with tempfile.TemporaryDirectory(prefix="pause-", dir=dest.parent) as tmp:
        binary = Path(tmp) / "pause"
        subprocess.run(
            ["go", "build", "-trimpath", "-ldflags=-s -w", "-o", str(binary), "pause.go"],
            cwd=HACK / "pause",
            env={**common.go_env(), "CGO_ENABLED": "0", "GO111MODULE": "off"},
            check=True,
        )
        layer = Path(tmp) / "layer.tar"
        with tarfile.open(layer, "w") as t:
            info = t.gettarinfo(str(binary), arcname="pause")
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            with binary.open("rb") as f:
                t.addfile(info, f)
        write_oci(layer, PAUSE, {"Entrypoint": ["/pause"]}, dest)


def ensure(name: str) -> Path:
    """The image's archive, built first when its recipe changed (or was never built)."""
    dest = archive_path(name)
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    say(f"building {reference(name)} (recipe {dest.name})")
    if name.endswith(NOSSHD_SUFFIX):
        build_nosshd(ensure(name.removesuffix(NOSSHD_SUFFIX)), reference(name), dest)
    elif name == "pause":
        build_pause(dest)
    elif name == "pytorch":
        build_pytorch(dest)
    else:
        build_mpi(name, dest)
    for old in dest.parent.glob(f"{name}-*.oci.tar"):
        # openmpi-<digest>, not openmpi-nosshd-<digest>: the part after the name is a digest.
        rest = old.name.removeprefix(f"{name}-").removesuffix(".oci.tar")
        if old != dest and "-" not in rest:
            old.unlink()
    say(
        f"built {reference(name)} in {time.monotonic() - t0:.0f}s "
        f"({dest.stat().st_size / 2**20:.0f} MiB)"
    )
    return dest


#: Each no-sshd image after its base: its archive holds only what it adds (build_nosshd).
ALL = (
    "pause",
    "openmpi",
    "openmpi4",
    "mpich",
    "intel",
    "pytorch",
    *(f"{base}{NOSSHD_SUFFIX}" for base in NOSSHD_BASES),
)


def start_building(names: Sequence[str]) -> subprocess.Popen[bytes] | None:
    """Builds the images of ``names`` not built yet in a process of its own, one after another
    (its output goes where this process's does); None when all are built."""
    missing = [name for name in names if not archive_path(name).exists()]
    if not missing:
        return None
    say(f"building {', '.join(missing)} in the background")
    return subprocess.Popen([sys.executable, "-m", "hack.images", "build", *missing], cwd=ROOT)


# --- the training image ---------------------------------------------------------------------
# ``mpijob.local/pytorch-benchmark:openmpi`` is ``mpioperator/mpi-pi:openmpi``'s recipe (trixie,
# Open MPI 5, OpenSSH on 2222, ``mpiuser`` uid 1000, the same entrypoint, pi) plus Debian's
# ``python3-torch`` (CPU only; PyPI's torch wheels carry CUDA and are gigabytes),
# ``python3-mpi4py`` for the rendezvous, ``python-is-python3`` so commands written ``python ...``
# run, and hack/pytorch/pytorch_synthetic_benchmark.py at /examples/, where the seeds' commands
# look for it. It shares the pi image's MPI wiring by construction: its recipe is that recipe
# with packages and one file added, so a change there rebuilds this one too.

PYTORCH_REFERENCE = "mpijob.local/pytorch-benchmark:openmpi"
PYTORCH_BASE = "openmpi"
PYTORCH_PACKAGES = ["python3-torch", "python3-mpi4py", "python-is-python3"]
PYTORCH_SCRIPT = HACK / "pytorch" / "pytorch_synthetic_benchmark.py"


def pytorch_recipe() -> list[str]:
    """The Open MPI 5 pi image's mmdebstrap arguments, with the packages added and the
    benchmark copied in before the build tools are purged."""
    argv = mpi_recipe(PYTORCH_BASE)
    include = next(i for i, a in enumerate(argv) if a.startswith("--include="))
    argv[include] += "," + ",".join(PYTORCH_PACKAGES)
    install = (
        f'mkdir -p "$1/examples" && install -m 0755 {PYTORCH_SCRIPT} '
        '"$1/examples/pytorch_synthetic_benchmark.py"'
    )
    purge = next(i for i, a in enumerate(argv) if "apt-get purge" in a)
    argv.insert(purge, f"--customize-hook={install}")
    # Recommends would add compilers and BLAS variants the CPU path never loads.
    argv.insert(1, '--aptopt=APT::Install-Recommends "false"')
    return argv


def pytorch_archive_path() -> Path:
    files = [*RECIPE_FILES, PYTORCH_SCRIPT]
    argv = [a.replace(str(HACK), "hack") for a in pytorch_recipe()]
    extra = json.dumps([argv, EXTRA_DIRS, image_config(PYTORCH_BASE)])
    return cache_dir() / f"pytorch-{recipe_digest(files, extra)}.oci.tar"


def build_pytorch(dest: Path) -> None:
    build_rootfs("pytorch", pytorch_recipe(), PYTORCH_REFERENCE, image_config(PYTORCH_BASE), dest)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_build = sub.add_parser("build", help="build the images that are missing or out of date")
    p_build.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(ALL)}")
    sub.add_parser("paths", help="print each image's reference and cached archive")
    args = parser.parse_args()
    if args.cmd == "build":
        unknown = set(args.names) - set(ALL)
        if unknown:
            parser.error(f"unknown image(s) {sorted(unknown)}; choose from {', '.join(ALL)}")
        for name in args.names or ALL:
            ensure(name)
    else:
        for name in ALL:
            path = archive_path(name)
            print(f"{reference(name):40} {path}{'' if path.exists() else '  (not built)'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
