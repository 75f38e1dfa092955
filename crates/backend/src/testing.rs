//! `parity`: the suite every backend passes against the CPU reference (per op, per weight
//! type, NMSE bounds).
