#!/usr/bin/env bash
# mpirun with what this machine needs and nothing more: --allow-run-as-root only as root,
# --oversubscribe only when there are fewer cores than ranks. Usage: mpirun.sh -np N cmd...
set -eu
np=1
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  [ "${args[$i]}" = "-np" ] && np=${args[$((i + 1))]}
done
extra=()
[ "$(id -u)" -eq 0 ] && extra+=(--allow-run-as-root)
[ "$(nproc)" -lt "$np" ] && extra+=(--oversubscribe)
# A small machine or a container often has no high-speed network: keep Open MPI on shared memory.
export OMPI_MCA_btl=${OMPI_MCA_btl:-self,vader}
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(( $(nproc) / np > 0 ? $(nproc) / np : 1 ))}
exec mpirun "${extra[@]}" -x OMP_NUM_THREADS "$@"
