// The MPI backend's entry points (internal to sharding/comm; only mpi_group.cpp includes mpi.h).
#pragma once
#include "sharding/comm/group.h"

namespace sw::comm {

// Initialises MPI if needed and returns a new group over a duplicate of MPI_COMM_WORLD.
GroupPtr make_mpi_world();
// Collective over g: a new communicator with g's ranks in g's order (made on g's communication
// thread in issue order, like split), as a Fortran handle (MPI_Comm_f2c turns it back; the
// caller frees it), so that headers stay free of mpi.h. -1 when g is not an MpiGroup.
int mpi_dup_comm_of(Group& g);
// MPI_COMM_WORLD rank, or -1 when MPI is not initialised.
int mpi_rank_if_initialized();
// MPI_Abort(MPI_COMM_WORLD, code) when MPI is initialised; returns otherwise.
void mpi_abort_if_initialized(int code);

}  // namespace sw::comm
