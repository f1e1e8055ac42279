/*
 * Monte Carlo estimate of pi over MPI, the program of the mpioperator/mpi-pi images.
 *
 * Every rank draws its own points in the square [-1, 1] x [-1, 1] from a generator seeded by its
 * rank, counts those inside the unit circle, and rank 0 sums the ratios of all ranks. Each rank
 * names its host, so the launcher's log shows which hosts took part.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>

#define SAMPLES 10000000L

/* splitmix64: small, fast and good enough to spread each rank's points evenly. */
static uint64_t next(uint64_t *state) {
    uint64_t z = (*state += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

static double uniform(uint64_t *state) {
    return (double)(next(state) >> 11) / (double)(1ULL << 53) * 2.0 - 1.0;
}

int main(int argc, char **argv) {
    int rank, size, name_len;
    char host[MPI_MAX_PROCESSOR_NAME];

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    MPI_Get_processor_name(host, &name_len);
    if (rank == 0) {
        printf("Workers: %d\n", size);
    }
    printf("Rank %d on host %s\n", rank, host);
    fflush(stdout);

    uint64_t state = (uint64_t)rank + 1;
    long inside = 0;
    for (long i = 0; i < SAMPLES; i++) {
        double x = uniform(&state), y = uniform(&state);
        if (x * x + y * y <= 1.0) {
            inside++;
        }
    }
    double ratio = (double)inside / (double)SAMPLES, sum = 0.0;
    MPI_Reduce(&ratio, &sum, 1, MPI_DOUBLE, MPI_SUM, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("pi is approximately %.16f\n", 4.0 * sum / size);
    }
    MPI_Finalize();
    return 0;
}
