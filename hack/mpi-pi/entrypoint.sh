#!/bin/sh
# The image's entrypoint: a launcher (K_MPI_JOB_ROLE=launcher) first waits until its own name and
# every host of /etc/mpi/hostfile resolve in the cluster's DNS, because MPICH and Intel MPI give
# up on a name that does not resolve yet (a pod's record appears once it is Ready), and their
# proxies on the workers connect back to the launcher by name. Then it runs the command.
set -e
if [ "$K_MPI_JOB_ROLE" = launcher ] && [ -r /etc/mpi/hostfile ]; then
  # /etc/hosts knows this pod's full name; without the cluster domain only DNS answers for it.
  self=$(hostname -f 2>/dev/null || hostname)
  for host in "${self%.cluster.local}" $(cut -d' ' -f1 /etc/mpi/hostfile | cut -d: -f1); do
    tries=0
    until getent hosts "$host" >/dev/null; do
      tries=$((tries + 1))
      if [ "$tries" -ge 240 ]; then
        echo "entrypoint: $host does not resolve after 120s" >&2
        exit 1
      fi
      sleep 0.5
    done
  done
fi
exec "$@"
