#!/bin/sh
# The image's entrypoint: a launcher (K_MPI_JOB_ROLE=launcher) first waits until its own name and
# every host of /etc/mpi/hostfile resolve, because MPICH and Intel MPI give up on a name that does
# not resolve yet (a worker's DNS record appears once its pod is up). Then it runs the command.
set -e
if [ "$K_MPI_JOB_ROLE" = launcher ] && [ -r /etc/mpi/hostfile ]; then
  for host in "$(hostname)" $(cut -d' ' -f1 /etc/mpi/hostfile | cut -d: -f1); do
    tries=0
    until getent hosts "$host" >/dev/null; do
      tries=$((tries + 1))
      if [ "$tries" -ge 120 ]; then
        echo "entrypoint: $host does not resolve after 60s" >&2
        exit 1
      fi
      sleep 0.5
    done
  done
fi
exec "$@"
