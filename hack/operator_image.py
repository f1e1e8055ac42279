#!/usr/bin/env python3
"""The operator's own image, built as the ``Dockerfile`` builds it but without Docker or a registry.

Both recipes make the same image: Debian bookworm's ``python3`` (3.11), a virtualenv at
``/opt/mpijob`` holding the project's wheel and its runtime dependencies from PyPI, ``PATH``
leading to that virtualenv, uid 65532 and ``mpijob-operator`` as the entrypoint, and the static
``mpijob-launch`` (``launch/``, the pods' agent of jobs launched without sshd) at
:data:`LAUNCH_BINARY`. Where they differ is only how the steps run:

- the ``Dockerfile``: ``debian:bookworm-slim``, ``apt-get install python3 python3-venv`` in a
  build stage, ``pip install /src`` from PyPI, the virtualenv copied onto a second
  ``bookworm-slim`` stage that has ``python3`` alone; ``mpijob-launch`` built in a
  ``golang`` stage and copied in;
- here: mmdebstrap makes the bookworm rootfs (``--variant=apt``, the same package set as
  ``bookworm-slim``) with ``python3`` and ``python3-venv``; ``pip wheel`` on this machine turns
  the project and its dependencies into wheels (each dependency pinned to the version installed
  in the environment running this script, the one the test suite runs against); inside the
  rootfs, ``pip install --no-index`` installs those wheels into the virtualenv, and
  what no runtime reads is removed (:data:`TRIM`), and ``python3-venv`` and ``binutils`` are
  purged again, which leaves what the Dockerfile's second stage holds; ``mpijob-launch``, built
  on this machine with the same flags (hack/launch_binary.py), is installed as root, mode 0755.

The result is one layer in an OCI archive under ``~/.cache/mpijob-operator/images/``, named after
a digest of its recipe: the project's sources (``pyproject.toml`` and ``operator/``), the pinned
dependency versions, the build steps and ``mpijob-launch``'s own digest (its sources and build
flags). README.md reaches the wheel only as its long
description and is left out, so a documentation edit rebuilds nothing. The image is known to the
real nodes' containerd as ``mpijob.local/mpijob-operator:<digest>`` (:func:`reference`), which
the local install overlays select (hack/incluster.py), and as ``mpijob-operator:<version>``, the
name the shipped manifests use.

Usage: python -m hack.operator_image build | path | reference
"""

from __future__ import annotations

import argparse
import fcntl
import json
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from importlib import metadata
from pathlib import Path

from hack import images, launch_binary  # images: the cache, the OCI writer

HACK = Path(__file__).resolve().parent
ROOT = HACK.parent
NAME = "mpijob-operator"
REPO = f"mpijob.local/{NAME}"
SUITE = "bookworm"
VENV = "/opt/mpijob"
#: Where the image holds ``mpijob-launch``, which the pods of a job launched without sshd copy
#: (mpijob.desired.launch.IMAGE_BINARY; the Dockerfile's last COPY).
LAUNCH_BINARY = "/usr/local/bin/mpijob-launch"
# What the Dockerfile's build stage installs; the runtime keeps python3 only (binutils: strip).
PACKAGES = ["python3", "python3-venv", "binutils"]
BUILD_ONLY = ["python3-venv", "binutils"]
#: What mmdebstrap's rootfs holds beyond ``bookworm-slim`` plus ``python3`` (the Dockerfile's
#: runtime stage), purged with the build-only packages: python3-venv's dependencies, which apt
#: keeps as installed by hand, and usrmerge, which mmdebstrap adds to merge /usr, with the full
#: Perl it pulls in (about 48 MiB; slim has only perl-base).
NOT_IN_SLIM = [
    "python3.11-venv",
    "python3-pip-whl",
    "python3-setuptools-whl",
    "python3-distutils",
    "python3-lib2to3",
    "usrmerge",
    "libfile-find-rule-perl",
    "libnumber-compare-perl",
    "libtext-glob-perl",
    "perl",
    "perl-modules-5.36",
    "libperl5.36",
]
#: What no runtime reads, removed from the virtualenv by both recipes (the Dockerfile's build
#: stage runs exactly this): pip and setuptools (nothing is installed at run time), the
#: dependencies' own test suites, the official client's asyncio copy (nothing imports it), and the
#: debug symbols of compiled extension modules. The libraries that wheels vendor (``*.libs``) are
#: left as they are: auditwheel patched them, and strip can break a patched library.
TRIM = (
    f"{VENV}/bin/python -m pip uninstall -y -q pip setuptools"
    f" && rm -rf {VENV}/lib/python3*/site-packages/kubernetes/aio"
    f" && find {VENV} -depth -type d -name tests -exec rm -rf {{}} +"
    f" && find {VENV} -type f -name '*.so' ! -path '*.libs/*' -exec strip --strip-unneeded {{}} +"
)
#: Both recipes then compile every module of the virtualenv once, at build time. The image is
#: read-only and runs with PYTHONDONTWRITEBYTECODE, so without bytecode every start compiled its
#: whole import tree from source: the operator's imports cost 1.2 s of CPU instead of 0.45 s, the
#: node agent's 0.85 s instead of 0.2 s, on a 2-core machine (a restart waits for it, and every
#: node runs an agent). The image grows by about 55 MiB (256 to 311 MiB, uncompressed), most of
#: it the official client's models. ``unchecked-hash``: the bytecode is used as it is, whatever
#: copying or archiving does to the sources' modification times. What pip compiled at install
#: time is removed first, so every file is compiled the same way.
COMPILE = (
    f"find {VENV} -name __pycache__ -prune -exec rm -rf {{}} +"
    f" && {VENV}/bin/python -m compileall -q --invalidation-mode unchecked-hash {VENV}/lib"
)
#: ``SSL_CERT_FILE=/dev/null``: OpenSSL's default trust is the hashed directory
#: (``/etc/ssl/certs``, where Debian's ca-certificates links each CA by subject hash) and no
#: bundle file. The same CAs, each read when a chain names it, instead of all 144 parsed at
#: every start: aiohttp makes two default contexts when it is imported, which cost 54 ms of CPU
#: each on a 2-core machine against 3 ms. Neither the operator nor Kopf uses them (every
#: connection to the API server carries a context with the cluster's CA), so this is start-up
#: time, not trust; an image without CA certificates trusts none either way.
CONFIG = {
    "Env": [
        f"PATH={VENV}/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        "PYTHONDONTWRITEBYTECODE=1",
        "PYTHONUNBUFFERED=1",
        "SSL_CERT_FILE=/dev/null",
    ],
    "User": "65532:65532",
    "Entrypoint": [NAME],
    "Cmd": ["--help"],
}


def say(msg: str) -> None:
    print(f"[operator-image] {msg}", file=sys.stderr, flush=True)


def die(msg: str) -> SystemExit:
    return SystemExit(f"[operator-image] error: {msg}")


def version() -> str:
    return str(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"])


def sources() -> list[Path]:
    """The files that make the project's wheel (README.md aside, see the module docstring)."""
    tree = sorted(
        p
        for p in (ROOT / "operator").rglob("*")
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    )
    return [ROOT / "pyproject.toml", *tree]


def _requirement_names(dist: str) -> list[str]:
    """Runtime requirements of an installed distribution whose markers hold here (no extras)."""
    from packaging.requirements import Requirement

    out = []
    for line in metadata.requires(dist) or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({"extra": ""}):
            out.append(req.name)
    return out


def pins() -> list[str]:
    """``name==version`` for every runtime dependency of the project, transitively, as installed
    in this interpreter's environment (``make install``'s .venv)."""
    from packaging.requirements import Requirement

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    todo = [Requirement(r).name for r in project["dependencies"]]
    seen: dict[str, str] = {}
    while todo:
        name = todo.pop()
        key = name.lower().replace("_", "-")
        if key in seen:
            continue
        try:
            seen[key] = metadata.version(name)
        except metadata.PackageNotFoundError:
            raise die(
                f"{name} is not installed in {sys.prefix}; run this with the project's "
                "virtualenv (make install, then .venv/bin/python -m hack.operator_image)"
            ) from None
        todo += _requirement_names(name)
    return sorted(f"{k}=={v}" for k, v in seen.items())


def hooks(wheels: Path, launch: Path) -> list[str]:
    """mmdebstrap's customize hooks: the virtualenv, the wheels installed offline, the build-only
    packages purged, the files no runtime reads removed, ``mpijob-launch`` (the binary ``launch``)
    installed, the bytecode compiled."""
    chroot = 'env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin PIP_NO_CACHE_DIR=1 chroot "$1"'
    return [
        f'mkdir -p "$1/tmp/wheels" && cp {wheels}/*.whl "$1/tmp/wheels/"',
        # Kopf names itself after its user (getpass): uid 65532 needs a passwd entry.
        f"{chroot} useradd --system --uid 65532 --user-group --no-create-home "
        "--home-dir /nonexistent --shell /usr/sbin/nologin nonroot",
        f"{chroot} python3 -m venv {VENV}",
        f"{chroot} {VENV}/bin/pip install --quiet --no-index --find-links /tmp/wheels "
        f"--disable-pip-version-check {NAME}",
        f"{chroot} sh -c {shlex.quote(TRIM)}",
        f"{chroot} apt-get purge -y -qq --auto-remove {' '.join(BUILD_ONLY + NOT_IN_SLIM)}"
        " >/dev/null",
        'rm -rf "$1/tmp/wheels" "$1/var/cache/apt/archives"/*.deb "$1/var/lib/apt/lists"/* '
        '"$1/usr/share/doc" "$1/usr/share/man" "$1/usr/share/locale"',
        f'install -m 0755 -o root -g root {launch} "$1{LAUNCH_BINARY}"',
        f"{chroot} sh -c {shlex.quote(COMPILE)}",
    ]


def recipe() -> list[str]:
    """mmdebstrap's arguments up to the output path (``WHEELS`` stands for the wheel folder,
    ``LAUNCH_BINARY`` for the built ``mpijob-launch``)."""
    return [
        "mmdebstrap",
        "--mode=root",
        "--variant=apt",
        "--format=tar",
        "--quiet",
        f"--include={','.join(PACKAGES)}",
        *(f"--customize-hook={h}" for h in hooks(Path("WHEELS"), Path("LAUNCH_BINARY"))),
        SUITE,
    ]


def digest() -> str:
    extra = [recipe(), pins(), CONFIG, version(), launch_binary.digest()]
    return images.recipe_digest(sources(), json.dumps(extra))


def digest_of(archive: Path) -> str:
    return archive.name.removeprefix("operator-").removesuffix(".oci.tar")


def archive_path() -> Path:
    return images.cache_dir() / f"operator-{digest()}.oci.tar"


def reference(digest_: str | None = None) -> str:
    """The image's name in the real nodes' containerd: a new tag for every recipe."""
    return f"{REPO}:{digest_ or digest()}"


def release_reference() -> str:
    """The name the shipped manifests give the image (``mpijob-operator:<version>``), as
    containerd normalises it."""
    return f"docker.io/library/{NAME}:{version()}"


def build_wheels(dest: Path) -> None:
    """The project's wheel and its dependencies' (pinned), into ``dest``."""
    constraints = dest / "constraints.txt"
    constraints.write_text("\n".join(pins()) + "\n")
    # A folder of its own for the project's build, away from other builds of the tree.
    with tempfile.TemporaryDirectory(prefix="src-", dir=dest.parent) as src:
        shutil.copy2(ROOT / "pyproject.toml", src)
        shutil.copy2(ROOT / "README.md", src)
        shutil.copytree(
            ROOT / "operator", Path(src) / "operator", ignore=shutil.ignore_patterns("__pycache__")
        )
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "wheel",
                "--quiet",
                "--disable-pip-version-check",
                "--wheel-dir",
                str(dest),
                "--constraint",
                str(constraints),
                src,
            ],
            check=False,
        )
    if out.returncode != 0:
        raise die(f"pip wheel failed (exit {out.returncode}); it needs PyPI reachable")


def build(dest: Path) -> None:
    images.require_mmdebstrap("the operator's image")
    launch = launch_binary.ensure()
    with tempfile.TemporaryDirectory(prefix="operator-", dir=dest.parent) as tmp:
        wheels = Path(tmp) / "wheels"
        wheels.mkdir()
        t0 = time.monotonic()
        build_wheels(wheels)
        say(f"wheels ready in {time.monotonic() - t0:.0f}s")
        layer = Path(tmp) / "rootfs.tar"
        argv = [
            a.replace("WHEELS", str(wheels)).replace("LAUNCH_BINARY", shlex.quote(str(launch)))
            for a in recipe()
        ]
        result = subprocess.run([*argv, str(layer)], check=False)
        if result.returncode != 0:
            raise die(
                f"mmdebstrap failed (exit {result.returncode}); it needs Debian's archive "
                "(apt's sources) reachable"
            )
        images.add_dirs(layer, images.EXTRA_DIRS)
        images.write_oci(layer, reference(digest_of(dest)), CONFIG, dest)


def ensure() -> Path:
    """The image's archive, built first when its recipe changed (or was never built)."""
    dest = archive_path()
    if dest.exists():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    # Two test lanes may ask for the image at once (the real-node tests, the installs): one
    # builds it, the other waits and finds it built.
    with (dest.parent / ".operator-image.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if dest.exists():
            return dest
        return _build_into(dest)


def _build_into(dest: Path) -> Path:
    t0 = time.monotonic()
    say(f"building {reference()} (recipe {dest.name})")
    build(dest)
    # Two recipes stay: the test of a rolling upgrade runs the one before beside this one.
    olds = sorted(
        (p for p in dest.parent.glob("operator-*.oci.tar") if p != dest),
        key=lambda p: p.stat().st_mtime,
    )
    for old in olds[:-1]:
        old.unlink()
    size = dest.stat().st_size / 2**20
    say(f"built {reference()} in {time.monotonic() - t0:.0f}s ({size:.0f} MiB)")
    return dest


def import_into(ctr: list[str], archive: Path) -> list[str]:
    """Imports the archive with ``ctr`` (its address and namespace given) unless present, and
    tags it with the release name too; the references it now has."""
    ref = reference(digest_of(archive))
    present = subprocess.run(
        [*ctr, "images", "ls", "-q"], check=True, capture_output=True, text=True
    )
    if ref not in present.stdout.split():
        t0 = time.monotonic()
        subprocess.run([*ctr, "images", "import", str(archive)], check=True, capture_output=True)
        say(f"imported {ref} ({time.monotonic() - t0:.1f}s)")
    subprocess.run(
        [*ctr, "images", "tag", "--force", ref, release_reference()],
        check=True,
        capture_output=True,
    )
    return [ref, release_reference()]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("cmd", choices=["build", "path", "reference", "pins"])
    args = parser.parse_args()
    if args.cmd == "build":
        print(ensure())
    elif args.cmd == "path":
        path = archive_path()
        print(f"{path}{'' if path.exists() else '  (not built)'}")
    elif args.cmd == "reference":
        print(reference())
    else:
        print("\n".join(pins()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
